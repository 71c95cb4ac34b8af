"""What an evaluation's samples table is asked for: filters, an order, a page.

The table is drawn from each sample's row (:class:`~.views.SampleRow`), held
for the whole run, so filtering and sorting are passes over those rows and a
page is a slice of the result. The query lives in the URL (a GET form and
plain links), so it needs no script, and an episode page opened from the
table keeps it: its previous and next are the neighbours in the same
filtered, sorted list.
"""

from __future__ import annotations

import math
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from .views import SampleRow

#: The orders the table offers, each a key on a row.
SORTS: dict[str, Callable[[SampleRow], Any]] = {
    "index": lambda r: r.index,
    "reward": lambda r: r.reward,
    "task": lambda r: r.task,
    "error": lambda r: r.error,
    "input_tokens": lambda r: r.input_tokens,
    "output_tokens": lambda r: r.output_tokens,
}
CORRECT = ("yes", "no", "unscored")
ERROR = ("yes", "no")
#: The longest text a filter keeps.
MAX_FILTER_CHARS = 500


def _bound(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class SampleQuery:
    task: str = ""
    correct: str = ""  # one of CORRECT, or "" for any
    error: str = ""  # "yes": with an error, "no": without, else any (or text the error holds)
    category: str = ""  # the error's category (``SampleRow.category``), exactly
    min: str = ""  # the lowest reward shown
    max: str = ""  # the highest reward shown
    sort: str = "index"
    order: str = "asc"

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> SampleQuery:
        values = {
            f.name: (params.get(f.name) or "").strip()[:MAX_FILTER_CHARS] for f in fields(cls)
        }
        if values["sort"] not in SORTS:
            values["sort"] = "index"
        if values["order"] != "desc":
            values["order"] = "asc"
        return cls(**values)

    @property
    def filtered(self) -> bool:
        return bool(
            self.task or self.correct or self.error or self.category or self.min or self.max
        )

    @property
    def stored_order(self) -> bool:
        """No filter and the stored order: a page is a page of samples, read as
        such, and no other sample's row is needed."""
        return not self.filtered and self.sort == "index" and self.order == "asc"

    def matches(self, row: SampleRow) -> bool:
        if self.task and row.task != self.task:
            return False
        if self.correct:
            correct = row.correct
            shown = "unscored" if correct is None else "yes" if correct else "no"
            if shown != self.correct:
                return False
        if self.error == "yes" and row.error is None:
            return False
        if self.error == "no" and row.error is not None:
            return False
        if (
            self.error not in ("", "yes", "no")
            and self.error.casefold() not in (row.error or "").casefold()
        ):
            return False
        if self.category and row.category != self.category:
            return False
        low, high = _bound(self.min), _bound(self.max)
        if low is not None or high is not None:
            reward = row.reward
            if reward is None or not math.isfinite(reward):
                return False
            if (low is not None and reward < low) or (high is not None and reward > high):
                return False
        return True

    def apply(self, rows: Sequence[SampleRow]) -> list[SampleRow]:
        """The rows this query shows, in its order; rows without the sorted value go last."""
        shown = [r for r in rows if self.matches(r)]
        if self.sort == "index":
            return shown[::-1] if self.order == "desc" else shown
        key = SORTS[self.sort]
        present = [r for r in shown if _sortable(key(r))]
        missing = [r for r in shown if not _sortable(key(r))]
        present.sort(key=lambda r: (key(r), r.index), reverse=self.order == "desc")
        return present + missing

    def params(self, **changes: str) -> str:
        """This query (with ``changes``) as a URL query string, defaults left out."""
        page = changes.pop("page", "1")
        changed = replace(self, **changes)
        defaults = SampleQuery()
        pairs = [
            (f.name, getattr(changed, f.name))
            for f in fields(changed)
            if getattr(changed, f.name) != getattr(defaults, f.name)
        ]
        if page != "1":
            pairs.append(("page", page))
        return urllib.parse.urlencode(pairs)

    def sorted_by(self, column: str) -> str:
        """The query string of a column header's link: by that column, or reversed if already."""
        order = "desc" if self.sort == column and self.order == "asc" else "asc"
        return self.params(sort=column, order=order)


def _sortable(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def neighbours(rows: Sequence[SampleRow], index: int) -> tuple[int | None, int | None]:
    """The sample indexes before and after sample ``index`` in ``rows`` (None at an end,
    or both when it is not among them)."""
    for position, row in enumerate(rows):
        if row.index == index:
            before = rows[position - 1].index if position > 0 else None
            after = rows[position + 1].index if position + 1 < len(rows) else None
            return before, after
    return None, None
