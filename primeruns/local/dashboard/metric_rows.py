"""A training run's metric rows as the charts read them, within bounds, from either source.

A run may log 100,000 steps of hundreds of metrics, or thousands of distinct
names: rows are reduced to their ``step`` and numeric values as they are
read, and past :data:`MAX_METRIC_NAMES` names the rest are counted and said,
never kept. Past :data:`MAX_METRIC_VALUES` values the rows held are thinned,
not cut: each metric keeps its lowest and highest value per bucket of steps
(and its first and latest point), the buckets' width doubling until they fit
in half the bound, so the charts span the whole run, first step to last
(rows past the bound were left out: a 3-day run of 20 metrics charted its
first 15,000 steps and never its latest). The offline index
(``journal_index``) keeps one between pages; the platform's source reads
one per page (it read and kept every row: 450 MB and 11 s a page for
100,000 steps of 20 metrics), knowing the run's rows before: its first
thinning is at the width the whole run needs, and the rows past it are
taken as columns (:meth:`MetricRows.extend`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain, islice, repeat
from operator import gt, itemgetter
from typing import Any

from ..traces_extract import number

#: Metric values kept for the charts, and distinct metric names charted.
MAX_METRIC_VALUES = 300_000
MAX_METRIC_NAMES = 100
#: Rows of a thinned run taken together as columns (``MetricRows.extend``).
BULK_ROWS = 4096


@dataclass
class MetricRows:
    """The rows kept so far (``step`` and numeric values only) and what they hold."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    values: int = 0
    names: set[str] = field(default_factory=set)
    #: Rows offered, kept or not: a row without a step is placed at its
    #: position among them, as ``charts.metric_points`` places it.
    offered_rows: int = 0
    #: Values offered, kept or thinned out (what :attr:`cut` says).
    offered: int = 0
    #: The step buckets' width once thinned (0: every row is kept).
    width: int = 0
    #: How many of :attr:`rows` (the first) are thinned at :attr:`width`.
    thinned: int = 0
    #: Names that are not valid Unicode (lone surrogates, which ``json``
    #: reads from ``"\\ud800"``), each as it is charted.
    repaired: dict[str, str] = field(default_factory=dict)
    #: The rows the whole run holds, where the reader knows before reading
    #: them (the platform counts a run's rows): a thinning picks the width
    #: the whole run will need, from the rows read so far, not the width
    #: those rows alone need. Doubled at each thinning as the rows went on,
    #: it re-thinned every row held a dozen times over a 100,000-step run of
    #: 20 metrics (5.6 s of the page's CPU, 80% of it thinning).
    expected_rows: int = 0

    @property
    def cut(self) -> str | None:
        """What the page says once the curves were thinned."""
        if not self.width:
            return None
        return (
            f"curves thinned: {self.values} of {self.offered} metric values shown, each"
            f" metric's lowest and highest per {self.width} steps, and its first and latest"
        )

    @property
    def cost(self) -> int:
        """Roughly what the rows hold, in bytes (a cache of them is bounded by it)."""
        return 100 * (self.values + len(self.rows) + 1)

    def copy(self) -> MetricRows:
        """Another holder of the same rows, to add to without changing this
        one (a page may be drawing from it: pages are served from several
        threads). The rows themselves are shared: thinning makes new ones."""
        return replace(
            self, rows=list(self.rows), names=set(self.names), repaired=dict(self.repaired)
        )

    def add(self, record: dict[str, Any]) -> None:
        """Keep ``record``'s numbers, and thin what is held once it reaches the bound."""
        # Sorted by type alone (a bool is not a number; JSON decodes to plain
        # ints and floats): whether a number is finite is asked once, where
        # points are made (``charts.metric_points``). Names already charted
        # are taken in one comprehension: every row of a long run is read.
        names = self.names
        row: dict[str, Any] = {
            name: value
            for name, value in record.items()
            if name in names and (type(value) is float or type(value) is int)
        }
        for name in record.keys() - names:
            value = record[name]
            kind = type(value)
            if (kind is not float and kind is not int) or name == "step":
                continue
            if (charted := self._named(name)) is not None:
                row[charted] = value
        step = record.get("step")
        # A bool is not a step. A row without one keeps the place
        # ``metric_points`` gives it, its position, once rows before it are thinned.
        row["step"] = step if type(step) is int else self.offered_rows
        self.offered_rows += 1
        self.values += len(row)
        self.offered += len(row)
        self.rows.append(row)
        if self.values >= MAX_METRIC_VALUES:
            self._thin()

    def extend(self, records: Iterable[dict[str, Any]]) -> None:
        """:meth:`add` each of ``records``, in step order (each row's step,
        or its place for a row without one); once thinned, in runs of
        :data:`BULK_ROWS` taken as columns (:meth:`_add_thinned`): a
        100,000-step run of 20 metrics, its rows reduced one at a time and
        thinned as they came, took 5.6 s of CPU."""
        records = iter(records)
        for record in records:
            self.add(record)
            if self.width:
                break
        while bulk := list(islice(records, BULK_ROWS)):
            if not self._add_thinned(bulk):
                for record in bulk:
                    self.add(record)

    def _add_thinned(self, records: list[dict[str, Any]]) -> bool:
        """Add ``records`` thinned at the width so far, as columns, without
        a row made for each: only for the rows of a long run as it nearly
        always is, each with the same keys, a step, in step order, and no
        number under a name not yet charted (a new name is taken in its
        place among the names, by :meth:`add`). Whether they were."""
        keys = records[0].keys()
        if len(keys) < 2 or "step" not in keys or any(record.keys() != keys for record in records):
            return False
        steps = [record["step"] for record in records]
        if set(map(type, steps)) != {int} or any(map(gt, steps, steps[1:])):
            return False
        if self.rows and steps[0] < self.rows[-1]["step"]:
            return False  # the rows held stay in step order (``_thin_tail``)
        if self.thinned < len(self.rows):
            # The rows added one at a time since, so all held are thinned; at
            # the width so far (``_thin`` doubles it unless half the bound is
            # held, and fewer than the bound may be more than half).
            self._thin_tail()
        names = self.names
        columns: dict[str, Sequence[Any]] = {}
        offered = len(records)  # a step each
        for key in keys:
            if key == "step":
                continue
            # Each key's column by a getter mapped over the records (every
            # record has every key): a tuple a record transposed by ``zip``
            # built each value's place twice.
            column: Sequence[Any] = list(map(itemgetter(key), records))
            kinds = set(map(type, column))
            if not kinds & {int, float}:
                continue  # no number under it
            charted = key if key in names else self.repaired.get(key) or _repaired(key)
            if charted not in names:
                if len(names) < MAX_METRIC_NAMES:
                    return False  # a new name: taken in its place by ``add``
                continue  # past the names charted, as ``add`` leaves it
            if charted in columns:
                return False  # two names charted as one
            if kinds <= {int, float}:
                offered += len(column)
            else:  # a bool, a string: not a number
                column = tuple(v if type(v) is float or type(v) is int else None for v in column)
                offered += len(column) - column.count(None)
            columns[charted] = column
        width = self.width
        buckets = [step // width for step in steps]
        keep = _kept_places(columns.items(), buckets)
        # ``_``-named values (a row's time) stay with the values kept in their row.
        timed = [name for name in columns if name[:1] == "_"]
        for place in sorted(keep):
            row = {"step": steps[place]}
            for name in chain(keep[place], timed):
                value = columns[name][place]
                if value is not None:
                    row[name] = value
            self.rows.append(row)
            self.values += len(row)
        self.offered += offered
        self.offered_rows += len(records)
        self.thinned = len(self.rows)
        if self.values >= MAX_METRIC_VALUES:
            self._thin()
        return True

    def _thin(self) -> None:
        """Keep each metric's extremes per step bucket, the buckets widening
        until half the bound is held: the next thinning is as many rows
        later, so each value is looked at a few times at most however long
        the run."""
        if self.width and self._thin_tail():
            return
        steps = [row["step"] for row in self.rows]
        span = max(steps) - min(steps)
        # What the rows held will be once the whole run is read: as many
        # times what they are as the run has rows for each read so far (the
        # same where the reader does not know: the rows read are the run).
        # Kept as two ints, ``whole`` rows for each ``read``: a step may be
        # an int past the floats (a journal is untrusted, ``json`` reads 400
        # digits), and the span times a float was an OverflowError.
        read = max(self.offered_rows, 1)
        whole = max(self.expected_rows, read)
        # Twice the width so far (thinning at it was not enough), else one
        # that would leave about eight rows a bucket; doubled until they fit
        # (the whole run's, projected). Buckets nest as the width doubles, so
        # each thinning may start from the rows the last one kept.
        width = 2 * self.width or max(2, 8 * span // max(len(steps), 1))
        if not self.width and whole > read:
            # At least the width leaving each metric's lowest and highest of
            # the whole run's buckets in half the bound: the first thinnings
            # at narrower ones, of every row held, were most of the cost.
            needed = span * whole * 2 * len(self.names) // (read * (MAX_METRIC_VALUES // 2))
            width = max(width, needed)
        while True:
            self.rows = _extremes(self.rows, width, self.names)
            self.values = sum(map(len, self.rows))
            self.width, self.thinned = width, len(self.rows)
            if self._fits(width, span, whole, read):
                break
            if width * read > span * whole:
                break
            width *= 2

    def _fits(self, width: int, span: int, whole: int, read: int) -> bool:
        """Whether the values held once the whole run is read at ``width``
        fit in half the bound: as many per bucket as the rows held keep, in
        as many buckets as the whole run's steps (``whole / read`` times the
        ``span`` of the rows held) reach. In ints: a step may be past the floats."""
        half = MAX_METRIC_VALUES // 2
        if whole <= read:
            return self.values <= half
        buckets = max(len({row["step"] // width for row in self.rows}), 1)
        # values / buckets * max(buckets, span * whole / (read * width)) <= half
        if span * whole <= buckets * read * width:
            return self.values <= half
        return self.values * span * whole <= half * buckets * read * width

    def _thin_tail(self) -> bool:
        """Thin at the width so far only the rows read since the last
        thinning, with the rows before in the buckets they reach (the last
        one; more for a step logged again): the rows before are thinned
        already, and kept in step order. Whether that was enough."""
        rows, width, head = self.rows, self.width, self.thinned
        if not head:
            return False
        if head == len(rows):
            # All thinned, a run of rows at a time (``_add_thinned``): each
            # run kept its own first and latest points, thinned out here.
            head = 0
        tail = min(row["step"] for row in rows[head:]) // width
        cut = head
        while cut and rows[cut - 1]["step"] // width >= tail:
            cut -= 1
        kept = _extremes(rows[cut:], width, self.names)
        self.rows = rows[:cut] + kept
        self.values = sum(map(len, self.rows))
        self.thinned = len(self.rows)
        return self.values <= MAX_METRIC_VALUES // 2

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


def _extremes(rows: list[dict[str, Any]], width: int, names: set[str]) -> list[dict[str, Any]]:
    """Per metric and bucket of ``width`` steps, only the rows holding its
    lowest and highest value, and its first and latest point (by step,
    then arrival, as ``metric_points`` orders them). A value that is not
    finite is never drawn, so it is not kept (a NaN would stand for its
    bucket's extremes); ``_``-named values (a row's time) stay with the
    values kept in their row. Each metric is taken as a column and each
    bucket's extremes found by ``min`` and ``max`` over a slice: a loop
    per value took 10 s over a 100,000-step run of 20 metrics."""
    steps = [row["step"] for row in rows]
    order = sorted(range(len(rows)), key=steps.__getitem__)  # stable: ties by arrival
    ordered = [rows[i] for i in order]
    buckets = [steps[i] // width for i in order]  # non-decreasing
    # Per row (its place in ``order``): the names whose values it keeps.
    keep = _kept_places(_columns(ordered, names), buckets)
    thinned: list[dict[str, Any]] = []
    for place in sorted(keep):
        row, kept_names = ordered[place], keep[place]
        if len(kept_names) + 1 < len(row):  # it holds values not kept (or a ``_`` one)
            row = {
                key: value
                for key, value in row.items()
                if key == "step" or key[:1] == "_" or key in kept_names
            }
        thinned.append(row)
    return thinned


def _kept_places(
    columns: Iterable[tuple[str, Sequence[Any]]], buckets: list[int]
) -> dict[int, list[str]]:
    """Per row (its place in the columns, in step order): the names whose
    values it keeps (``_extreme_places`` of each column)."""
    dense: list[list[tuple[int, int]]] = []
    keep: dict[int, list[str]] = {}
    for name, column in columns:
        for place in _extreme_places(column, buckets, dense):
            holders = keep.get(place)
            if holders is None:
                keep[place] = [name]
            else:
                holders.append(name)
    return keep


def _extreme_places(
    column: Sequence[Any], buckets: list[int], dense: list[list[tuple[int, int]]]
) -> list[int]:
    """Where in ``column`` (one metric's numbers in step order, None where
    a row has none; ``buckets`` each row's) its first and latest finite
    values are, and each bucket's lowest and highest. ``dense`` holds the
    buckets' bounds once found for a column every row holds a number of:
    the same for each such column."""
    values: Sequence[Any] = column
    at: list[int] | None = None  # where ``values`` are in ``column`` (None: each row)
    if None in values:
        at = [k for k, value in enumerate(values) if value is not None]
        values = [values[k] for k in at]
    # Nearly always floats, all finite: asked of the column at once (a
    # NaN or an infinity makes the sum one), else value by value.
    if set(map(type, values)) != {float} or (total := sum(values)) - total != 0.0:
        finite = [k for k, value in enumerate(values) if _finite(value)]
        at = finite if at is None else [at[k] for k in finite]
        values = [values[k] for k in finite]
    if not values:
        return []
    if at is None:
        if not dense:
            dense.append(_bounds(buckets))
        spans = dense[0]
    else:
        spans = _bounds([buckets[k] for k in at])
    kept = {0, len(values) - 1}  # its first and latest point
    for start, stop in spans:
        if stop - start <= 2:
            kept.update(range(start, stop))
            continue
        chunk = values[start:stop]
        kept.add(start + chunk.index(min(chunk)))
        kept.add(start + chunk.index(max(chunk)))
    return list(kept) if at is None else [at[k] for k in kept]


def _columns(rows: list[dict[str, Any]], names: set[str]) -> Iterator[tuple[str, Sequence[Any]]]:
    """Each of ``names`` with its value in each of ``rows`` (None where a row
    has none), by ``dict.get`` mapped over the rows, in C: a comprehension
    of ``get`` a value took two to three times as long, and told apart, the
    names every row holds (taken together, a tuple a row transposed) cost a
    count of every row's names as long as reading them."""
    for name in names:
        yield name, list(map(dict.get, rows, repeat(name)))


def _bounds(buckets: list[int]) -> list[tuple[int, int]]:
    """Where each bucket starts and stops in ``buckets`` (non-decreasing)."""
    bounds = []
    start, end = 0, len(buckets)
    while start < end:
        stop = bisect_right(buckets, buckets[start], start, end)
        bounds.append((start, stop))
        start = stop
    return bounds


def _finite(value: Any) -> bool:
    """Whether ``value`` (an int or a float, as rows hold) is drawn: finite."""
    if type(value) is float:
        return value - value == 0.0
    return value is not None and number(value) is not None


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
