"""The training curves as data for the browser: one chart per metric, drawn by uPlot.

uPlot was chosen by measurement (``tools/bench/chart_choice.py``): hover
values, zoom and a log axis in 50 kB of script that draws 100,000 points in a
fraction of plotly's or bokeh's time, where pygal's SVG offered no interaction
at all. The script comes from an installed package (see :mod:`.vendor`), never
from a CDN. The server still decides what is drawn: a long curve is cut to
``MAX_DRAWN`` points (its extremes kept) so a page's weight does not grow with
the run. Each chart's points travel as JSON in a ``data-curve`` attribute,
which Jinja2 escapes: a metric or run name is data, never markup, and
``curves.js`` puts it on the page as text.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, TypeVar

from ..traces_extract import number

#: A longer curve is drawn from this many of its points (a chart a few hundred
#: pixels wide cannot show more), so a long live run's page stays quick to render.
MAX_DRAWN = 2000

#: A point: its step, value and wall time (seconds since the epoch, or None).
Point = tuple[int, float, float | None]
P = TypeVar("P", bound=tuple[Any, ...])


def decimate(points: Sequence[P], limit: int = MAX_DRAWN) -> list[P]:
    """At most about ``limit`` of ``points`` (each ``(step, value, ...)``), in
    order: each run of consecutive points keeps its lowest and its highest, so
    a spike still shows; the last point is always kept (it is the value the
    caption gives)."""
    if len(points) <= limit:
        return list(points)
    size = math.ceil(len(points) / (limit // 2))
    # The values alone, so a bucket's lowest and highest are found by
    # ``min`` and ``max`` over floats, not a key called per point.
    values = list(map(itemgetter(1), points))
    kept: list[P] = []
    for start in range(0, len(points), size):
        bucket = values[start : start + size]
        low = points[start + bucket.index(min(bucket))]
        high = points[start + bucket.index(max(bucket))]
        kept += [low] if low is high else [low, high] if low[0] <= high[0] else [high, low]
    if kept[-1] != points[-1]:
        kept.append(points[-1])
    return kept


def metric_points(rows: list[dict[str, Any]]) -> dict[str, list[Point]]:
    """Per numeric metric of ``rows``, its finite points in step order. A row's
    wall time is its ``_timestamp`` (the SDK's: when ``log_metrics`` was
    called); a row without a ``step`` is placed by its position.

    This is where a value is checked for being a finite number, once: the
    rows a source keeps (``MetricRows``) are only sorted by type. A finite
    float, nearly every value, is taken without a call (ten long runs on
    the compare page are millions of values)."""
    out: dict[str, list[Point]] = {}
    for index, row in enumerate(rows):
        step = row.get("step")
        if type(step) is int and -_WIDE < step < _WIDE:  # nearly every row's
            at = step
        else:
            placed = number(step)
            at = index if placed is None else step if isinstance(step, int) else int(placed)
        stamp = row.get("_timestamp")
        when = stamp if type(stamp) is float and stamp - stamp == 0.0 else number(stamp)
        for key, value in row.items():
            if key == "step" or key[:1] == "_":
                continue
            # A NaN, an infinity or an integer past the floats (a journal is
            # untrusted) has no place on an axis; the others still draw.
            # ``value - value`` is 0.0 for a finite float, NaN otherwise.
            if type(value) is not float or value - value != 0.0:
                value = number(value)
                if value is None:
                    continue
            points = out.get(key)
            if points is None:
                points = out[key] = []
            points.append((at, value, when))
    for points in out.values():
        points.sort(key=_step)
    return out


#: A point's step, the key points are sorted and kept in order by.
_step = itemgetter(0)
#: A step within this (either side) is an integer a float holds without overflow.
_WIDE = 2**64


@dataclass(frozen=True)
class Series:
    """One run's line on a chart: what ``curves.js`` draws."""

    label: str
    points: list[Point]
    #: The run's place on the page: its colour, the same on every chart.
    slot: int = 0

    def as_json(self) -> dict[str, Any]:
        times = [t for _, _, t in self.points]
        return {
            "label": self.label,
            "slot": self.slot,
            "step": [s for s, _, _ in self.points],
            "value": [v for _, v, _ in self.points],
            # Wall time only when every drawn point has one (else that axis is off).
            "time": times if all(t is not None for t in times) else None,
        }


@dataclass(frozen=True)
class Curve:
    """One metric's chart: its caption's figures and the data it is drawn from."""

    name: str
    points: int
    last_step: int | None
    last_value: float | None
    #: How many of the points are drawn (all of them up to ``MAX_DRAWN``).
    drawn: int = 0
    series: list[Series] = field(default_factory=list)

    @property
    def data(self) -> str:
        """The chart as JSON, for the page's ``data-curve`` attribute (Jinja2 escapes it)."""
        return json.dumps(
            {"name": self.name, "series": [s.as_json() for s in self.series]},
            allow_nan=False,
            separators=(",", ":"),
        )


def curves(metrics: list[dict[str, Any]], label: str = "") -> list[Curve]:
    """A chart per numeric metric of ``metrics`` (rows with their ``step``), by name."""
    out = []
    for name, points in sorted(metric_points(metrics).items()):
        last = points[-1] if points else (None, None, None)
        drawn = decimate(points)
        out.append(
            Curve(name, len(points), last[0], last[1], len(drawn), [Series(label or name, drawn)])
        )
    return out


#: A run's lines: per metric, how many points it logged and those drawn (decimated).
Lines = dict[str, tuple[int, list[Point]]]


def lines_of(rows: list[dict[str, Any]]) -> Lines:
    """A run's metric rows as what its lines on an overlay draw: the compare
    page keeps these, not the rows, while it reads the next run (ten runs'
    rows held at once took 590 MB)."""
    return {name: (len(points), decimate(points)) for name, points in metric_points(rows).items()}


def overlay(runs: Sequence[tuple[str, list[dict[str, Any]]]]) -> list[Curve]:
    """A chart per metric any of ``runs`` (label, metric rows) logged, with a
    line per run that logged it, in the order given: the compare page's."""
    return overlay_lines([(label, lines_of(rows)) for label, rows in runs])


def overlay_lines(runs: Sequence[tuple[str, Lines]]) -> list[Curve]:
    """As :func:`overlay`, from each run's :func:`lines_of`."""
    names = sorted({name for _, lines in runs for name in lines})
    out = []
    for name in names:
        lines = [
            Series(label, by_name[name][1], slot)
            for slot, (label, by_name) in enumerate(runs)
            if by_name.get(name, (0, []))[1]
        ]
        total = sum(by_name[name][0] for _, by_name in runs if by_name.get(name, (0, []))[1])
        out.append(Curve(name, total, None, None, sum(len(s.points) for s in lines), lines))
    return out
