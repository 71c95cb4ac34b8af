"""Finding runs in the runs list: a search box and filters, over the rows the list already has.

The list is read whole by its source (the platform's database, or a directory
of journals), so finding is a pass over those rows in memory: nothing more is
read, and a source with a cached index (``serve --runs-dir``) keeps it. The
query lives in the page's URL (a GET form), so a search is a link to share and
works with no script. Free text matches the name, the id, the model, an
environment or a tag, ignoring case; each filter must match exactly; dates are
days in UTC, both ends included.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from datetime import UTC, date, datetime

from .views import RunRow

#: The longest search text kept (a URL may carry any length).
MAX_QUERY_CHARS = 200


def _day(text: str) -> date | None:
    try:
        return date.fromisoformat(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class RunQuery:
    """What the runs list is asked for; empty strings ask for nothing."""

    q: str = ""
    kind: str = ""
    status: str = ""
    model: str = ""
    environment: str = ""
    tag: str = ""
    since: str = ""  # YYYY-MM-DD, the first day shown
    until: str = ""  # YYYY-MM-DD, the last day shown

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> RunQuery:
        values = {f.name: (params.get(f.name) or "").strip() for f in fields(cls)}
        values["q"] = values["q"][:MAX_QUERY_CHARS]
        return cls(**values)

    def params(self, page: int) -> str:
        """This query, on page ``page``, as a URL query string (empty values left out)."""
        pairs = [(f.name, getattr(self, f.name)) for f in fields(self) if getattr(self, f.name)]
        if page != 1:
            pairs.append(("page", str(page)))
        return urllib.parse.urlencode(pairs)

    @property
    def active(self) -> bool:
        return any(getattr(self, f.name) for f in fields(self))

    def _window(self) -> tuple[float | None, float | None]:
        """``since``..``until`` as epoch seconds: from the first day's start to the last's end."""
        first, last = _day(self.since), _day(self.until)
        start = None if first is None else _epoch(first)
        end = None if last is None else _epoch(last) + 86_400
        return start, end

    def matches(self, row: RunRow) -> bool:
        exact = (
            (self.kind, row.kind),
            (self.status, row.status),
            (self.model, row.model),
        )
        if any(want and want != have for want, have in exact):
            return False
        if self.environment and self.environment not in row.environments:
            return False
        if self.tag and self.tag not in row.tags:
            return False
        start, end = self._window()
        if start is not None or end is not None:
            if row.created_at is None:
                return False  # a run of unknown date is in no window
            if (start is not None and row.created_at < start) or (
                end is not None and row.created_at >= end
            ):
                return False
        if self.q:
            needle = self.q.casefold()
            words = (row.name, row.id, row.model, *row.environments, *row.tags)
            if not any(needle in w.casefold() for w in words if w):
                return False
        return True


def _epoch(day: date) -> float:
    return datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()


@dataclass(frozen=True)
class Choices:
    """The values each filter offers: those of the runs listed, sorted."""

    statuses: list[str]
    models: list[str]
    environments: list[str]
    tags: list[str]


def choices(rows: Iterable[RunRow]) -> Choices:
    statuses: set[str] = set()
    models: set[str] = set()
    environments: set[str] = set()
    tags: set[str] = set()
    for row in rows:
        statuses.add(row.status)
        if row.model:
            models.add(row.model)
        environments.update(row.environments)
        tags.update(row.tags)
    return Choices(sorted(statuses), sorted(models), sorted(environments), sorted(tags))
