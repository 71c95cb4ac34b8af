"""What a caller listing a runs directory again and again keeps between listings, within a bound.

The dashboard lists its runs directory at every reload of its runs page. It
keeps, per journal, the stamp of its files and what was listed of it, so an
unchanged journal is not even read from its summary again (``listing``).
What it kept grew with the runs directory, and a journal's listing holds its
meta values (up to a MiB each for the dashboard): thousands of runs, or a few
hostile ones, held as much for the life of the process. A memo holds at most
``max_bytes`` (each listing's cost estimated once, from its meta's encoded
size), the newest journals first: an older one left out is read from its
summary, which costs a little more, never a wrong answer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from primeruns.journal.summary import Files
from primeruns.journal.types import JournalInfo

__all__ = ["MEMO_BYTES", "Memo", "info_cost"]

#: What a memo holds at most, by default.
MEMO_BYTES = 64 << 20
#: What a listed journal costs beside its meta, roughly (paths, offsets, counts).
_BASE_COST = 2048


def info_cost(info: JournalInfo) -> int:
    """Roughly the bytes ``info`` holds: its meta and finish record as JSON, and the rest."""
    try:
        held = len(json.dumps([info.meta, info.finish], default=str))
    except (TypeError, ValueError, RecursionError):
        held = 1 << 20  # cannot be sized: taken as large
    return _BASE_COST + held + 64 * (len(info.cursors) + len(info.losses) + len(info.damage))


class Memo:
    """Per journal: its files as stamped (``summary.Files``) and what a listing
    of one kind (the same flags and bounds) said of it, within ``max_bytes`` in all."""

    def __init__(self, max_bytes: int | None = None) -> None:
        self.max_bytes = MEMO_BYTES if max_bytes is None else max_bytes
        self.bytes = 0
        self._entries: dict[str, tuple[Files, JournalInfo, int]] = {}  # by path

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, path: Path) -> tuple[Files, JournalInfo] | None:
        hit = self._entries.get(os.fspath(path))
        return None if hit is None else (hit[0], hit[1])

    def refill(self, listed: Iterable[tuple[Path, Files, JournalInfo]]) -> None:
        """Keep what the last listing said (``listed``, oldest first), the
        newest journals first, while they fit; nothing of an earlier listing.
        A listing that found every journal as remembered changes nothing
        (a reload of thousands of unchanged runs makes no new entry)."""
        rows = [(os.fspath(path), found, info) for path, found, info in listed]
        entries = self._entries
        if len(rows) == len(entries) and all(
            (hit := entries.get(key)) is not None and hit[0] is found and hit[1] is info
            for key, found, info in rows
        ):
            return
        earlier, self._entries, self.bytes = entries, {}, 0
        kept: list[tuple[str, tuple[Files, JournalInfo, int]]] = []
        for path, found, info in reversed(rows):
            prior = earlier.get(path)
            # An unchanged journal's listing shares its meta with the one
            # remembered: sized once, not at every listing.
            cost = prior[2] if prior is not None and prior[1].meta is info.meta else info_cost(info)
            if self.bytes + cost > self.max_bytes:
                continue
            self.bytes += cost
            kept.append((path, (found, info, cost)))
        self._entries = dict(reversed(kept))
