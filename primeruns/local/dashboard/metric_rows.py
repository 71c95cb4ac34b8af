"""A training run's metric rows as the charts read them, within bounds, from either source.

A run may log 100,000 steps of hundreds of metrics, or thousands of distinct
names: rows are reduced to their ``step`` and numeric values as they are
read, and past :data:`MAX_METRIC_VALUES` values or :data:`MAX_METRIC_NAMES`
names the rest are counted and said, never kept. The offline index
(``journal_index``) keeps one between pages; the platform's source reads
one per page, row by row, and stops at the bound (it read and kept every
row: 450 MB and 11 s a page for 100,000 steps of 20 metrics).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Metric values kept for the charts, and distinct metric names charted.
MAX_METRIC_VALUES = 300_000
MAX_METRIC_NAMES = 100


@dataclass
class MetricRows:
    """The rows kept so far (``step`` and numeric values only) and what they hold."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    values: int = 0
    names: set[str] = field(default_factory=set)
    #: Rows offered once full, and left out.
    left_out: int = 0
    #: Names that are not valid Unicode (lone surrogates, which ``json``
    #: reads from ``"\\ud800"``), each as it is charted.
    repaired: dict[str, str] = field(default_factory=dict)

    @property
    def full(self) -> bool:
        return self.values >= MAX_METRIC_VALUES

    @property
    def cut(self) -> str | None:
        """What the page says once rows were left out."""
        if not self.left_out:
            return None
        return f"metric rows past {MAX_METRIC_VALUES} values are not charted"

    @property
    def cost(self) -> int:
        """Roughly what the rows hold, in bytes (a cache of them is bounded by it)."""
        return 100 * (self.values + len(self.rows) + 1)

    def add(self, record: dict[str, Any]) -> str | None:
        """Keep ``record``'s numbers; the note to say when it is the first row left out."""
        if self.full:
            self.left_out += 1
            return self.cut if self.left_out == 1 else None  # said once
        row: dict[str, Any] = {}
        step = record.get("step")
        if type(step) is int:  # a bool is not a step
            row["step"] = step
        for name, value in record.items():
            # Sorted by type alone (a bool is not a number; JSON decodes to
            # plain ints and floats): whether a number is finite is asked
            # once, where points are made (``charts.metric_points``).
            kind = type(value)
            if (kind is not float and kind is not int) or name == "step":
                continue
            if name in self.names:
                row[name] = value
            elif (charted := self._named(name)) is not None:
                row[charted] = value
        self.values += len(row)
        self.rows.append(row)
        return None

    def _named(self, name: str) -> str | None:
        """``name`` as charted, for a name not yet in :attr:`names`: None past
        :data:`MAX_METRIC_NAMES`. A lone surrogate in it is replaced with
        U+FFFD, as the SDK repairs what it records: the page is UTF-8, and
        such a name made it a 500 (UnicodeEncodeError). Repairs are
        remembered up to the bound on names: countless names repair to one
        (``"x\\ud800"``, ``"x\\ud801"``, ...), each a value a row, so
        remembering each held memory in proportion to the bodies read."""
        charted = self.repaired.get(name)
        if charted is None:
            charted = _repaired(name)
            if charted is not name and len(self.repaired) < MAX_METRIC_NAMES:
                self.repaired[name] = charted
        if charted in self.names:
            return charted
        if len(self.names) >= MAX_METRIC_NAMES:
            return None
        self.names.add(charted)
        return charted


def _repaired(name: str) -> str:
    """``name`` itself if it is valid Unicode, else with each lone surrogate
    replaced with U+FFFD."""
    if name.isascii():
        return name
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        # A UTF-16 round trip joins split pairs; lone ones become U+FFFD.
        return name.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return name
