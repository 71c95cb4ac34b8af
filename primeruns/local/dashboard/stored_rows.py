"""Each evaluation sample's table row, stored beside its body as it arrives.

An evaluation's analysis, sort and filters read one row per sample
(:class:`~.views.SampleRow`: reward, task, error, tokens). Picked out of
the stored bodies by SQLite when a page asked, that cost a parse of every
body (about 22 KB each for the demo's gsm8k episodes: 440 MB of JSON for
20,000 samples, seconds on a first visit). The sample route has each body
parsed already, so it stores the row too (``eval_sample_rows``, keyed by
the body's own row), for a few microseconds a sample; a page then reads
those few columns only. Rows stored before this table existed have none,
and are picked out of their bodies as before (``PlatformSource``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import Any

from .rows import sample_row
from .views import SampleRow, compact

#: The stored columns, in :class:`SampleRow`'s names and order (after its index).
COLUMNS = (
    "sample_id",
    "reward",
    "error",
    "task",
    "input_tokens",
    "output_tokens",
    "category",
)


def store(conn: sqlite3.Connection, eval_id: str, stored: Iterable[tuple[int, Any]]) -> None:
    """The row of each (body's row, sample) just stored; a sample that is not
    an object has the row of an empty one."""
    values = []
    for row, sample in stored:
        fact = compact(sample_row(0, sample if isinstance(sample, dict) else {}))
        values.append((row, eval_id, *(getattr(fact, c) for c in COLUMNS)))
    marks = ", ".join("?" * (len(COLUMNS) + 2))
    conn.executemany(
        f"INSERT INTO eval_sample_rows (row, eval_id, {', '.join(COLUMNS)}) VALUES ({marks})",
        values,
    )


def read(
    conn: sqlite3.Connection, eval_id: str, after: int, limit: int, first: int
) -> list[tuple[int, SampleRow | None]]:
    """The evaluation's samples stored after body row ``after``, up to
    ``limit``, in order and numbered from ``first``: (body row, its stored
    row, or None when it has none)."""
    picked = ", ".join(f"f.{c}" for c in COLUMNS)  # SampleRow's own order, after index
    found = conn.execute(
        f"SELECT s.row, f.row, {picked} FROM eval_samples AS s"
        " LEFT JOIN eval_sample_rows AS f ON f.row = s.row"
        " WHERE s.eval_id = ? AND s.row > ? ORDER BY s.row LIMIT ?",
        (eval_id, after, limit),
    )
    return [
        (r[0], None if r[1] is None else SampleRow(first + i, *tuple(r)[2:]))
        for i, r in enumerate(found)
    ]
