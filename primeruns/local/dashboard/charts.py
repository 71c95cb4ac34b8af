"""The training curves: one pygal line chart per metric, drawn on the server as SVG.

pygal was chosen by measurement (``tools/bench/chart_choice.py``): a 0.5 MB
install, no JavaScript, and a 10,000-point page a fraction of plotly's or
bokeh's weight and render time. Its defaults would load tooltips from a CDN:
``js=[]`` keeps every byte on this machine. pygal writes its SVG through
ElementTree, which escapes metric names and values, so the markup is safe to
put in the page as it is once pygal's inline config script is dropped: a
chart runs no code (tests hold it to both).
"""

from __future__ import annotations

import functools
import math
import re
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from markupsafe import Markup

from ...reports import metric_curves


@functools.cache
def _pygal() -> ModuleType:
    """pygal, imported on the first chart: every platform start (tests start
    hundreds) would otherwise pay for it."""
    import pygal

    # pygal appends a legacy sys.meta_path finder (for its map plugins, which
    # these charts do not use). On Python 3.11 every import that fails after it
    # in this process falls through to it and warns (ImportWarning), so an
    # optional import elsewhere (httpcore probing for trio) raises where
    # warnings are errors.
    legacy = getattr(pygal, "PluginImportFixer", None)
    if legacy is not None:
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, legacy)]
    module: ModuleType = pygal
    return module


_SCRIPT = re.compile(r"<script\b[^>]*>.*?</script>", re.S)

#: Above this many points a curve is drawn as a line only: a dot per point
#: would weigh more than the line and hide it.
MAX_DOTS = 1000
#: Up to this many steps, every step gets its label on the x axis.
MAX_STEP_LABELS = 20
#: A longer curve is drawn from this many of its points (a 640-pixel-wide
#: chart cannot show more), so a long live run's page stays quick to render.
MAX_DRAWN = 2000


def decimate(points: list[tuple[int, float]], limit: int = MAX_DRAWN) -> list[tuple[int, float]]:
    """At most about ``limit`` of ``points``, in order: each run of consecutive
    points keeps its lowest and its highest, so a spike still shows; the last
    point is always kept (it is the value the caption gives)."""
    if len(points) <= limit:
        return points
    size = math.ceil(len(points) / (limit // 2))
    kept: list[tuple[int, float]] = []
    for start in range(0, len(points), size):
        bucket = points[start : start + size]
        low = min(bucket, key=lambda p: p[1])
        high = max(bucket, key=lambda p: p[1])
        kept += sorted({low, high})
    if kept[-1] != points[-1]:
        kept.append(points[-1])
    return kept


@dataclass(frozen=True)
class Curve:
    name: str
    points: int
    last_step: int | None
    last_value: float | None
    svg: Markup
    #: How many of the points are drawn (all of them up to ``MAX_DRAWN``).
    drawn: int = 0


def _chart(name: str, points: list[tuple[int, float]]) -> Markup:
    chart = _pygal().XY(
        js=[],
        disable_xml_declaration=True,
        show_legend=False,
        show_dots=len(points) <= MAX_DOTS,
        dots_size=3,
        width=640,
        height=260,
        x_title="step",
        title=name,
        explicit_size=False,
        margin=12,
    )
    steps = [step for step, _ in points]
    if steps and max(steps) - min(steps) <= MAX_STEP_LABELS:
        # Steps are whole numbers: a short run gets one label per step, not 0.2, 0.4...
        chart.x_labels = list(range(min(steps), max(steps) + 1))
    chart.add(name, points)
    svg = chart.render(is_unicode=True)
    # pygal always embeds its config (names included) as a script for tooltips
    # that are not loaded here: drop it, so a chart runs no code at all. Text in
    # the SVG is escaped, so the first closing tag is pygal's own.
    svg = _SCRIPT.sub("", svg)
    # pygal's ElementTree escaped every name and value in it (see the module docstring).
    return Markup(svg)


def curves(metrics: list[dict[str, Any]]) -> list[Curve]:
    """A chart per numeric metric of ``metrics`` (rows with their ``step``), by name."""
    out = []
    for name, raw in sorted(metric_curves(metrics).items()):
        # A NaN or an infinity has no place on an axis; the others still draw.
        points = [(step, value) for step, value in raw if math.isfinite(value)]
        last = points[-1] if points else (None, None)
        drawn = decimate(points)
        out.append(Curve(name, len(points), last[0], last[1], _chart(name, drawn), len(drawn)))
    return out
