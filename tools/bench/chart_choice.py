"""Which charting library draws the dashboard's training curves: measured, not guessed.

Run ``python tools/bench/chart_choice.py`` from the repository root (``--points N``
to change the 100,000-point series, ``--only NAME...`` for some candidates).
For each candidate, in a directory of its own (``pip install --target``,
dependencies included, so nothing already installed is counted or reused), it
reports:

- install size: the bytes ``pip`` puts on disk for the library and everything
  it pulls in;
- script weight: the JavaScript (and its CSS) a browser must load once to
  draw charts, as the candidate's wheel ships it (none for pygal);
- page weight: the bytes a browser downloads to show one self-contained page
  with one line chart of every point (no CDN: the JavaScript, if any, is inline);
- Python time: building that page on the server (median of 3);
- browser time: from navigation until the chart is drawn in Chromium (median
  of 3), through Playwright and the system browser; skipped without one;
- interaction: whether the library itself offers hover values, zoom (and pan)
  and a log axis, by the option that does it (``_OFFERS``); the measured page
  turns the log axis and the hover on where the library has them, so the
  option is exercised, not just named.

The candidates: pygal (SVG drawn on the server, no JavaScript; measured only
when named, ``--only pygal --points 10000``: three 100,000-point SVG builds
ran past six minutes, and it offers no interaction anyway), plotly and
bokeh (their wheels ship the JavaScript that draws in the browser), and the
light ones whose wheels ship a canvas charting script: dygraphs (dygraph.js),
uplot-python and youplot (both ship uPlot: 1.6.16 unminified and 1.6.31
minified, each byte for byte the npm package's ``dist`` file).

Measured on the 2-core machine of 2026-12-03 (the dashboard took youplot's uPlot):

| library | install size | script weight | page weight | Python time | browser time |
|---|---|---|---|---|---|
| youplot | 0.20 MB | 0.05 MB | 2.70 MB | 0.73 s | 0.55 s |
| uplot-python | 87.44 MB | 0.12 MB | 2.77 MB | 0.33 s | 0.77 s |
| dygraphs | 0.59 MB | 0.13 MB | 2.77 MB | 0.43 s | 0.90 s |
| plotly | 43.04 MB | 4.82 MB | 7.27 MB | 2.11 s | 10.24 s |
| bokeh | 113.79 MB | 1.27 MB | 3.72 MB | 1.22 s | 1.90 s |
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Each snippet builds one page from ``xs``/``ys`` and leaves its HTML in ``page``.
_BUILD = {
    "pygal": (
        "import pygal\n"
        "chart = pygal.XY(show_dots=False, show_legend=False, logarithmic=True,"
        " width=800, height=300)\n"
        "chart.add('reward', list(zip(xs, ys)))\n"
        "page = '<!doctype html><html><body>' + chart.render(is_unicode=True) + '</body></html>'\n"
    ),
    "plotly": (
        "import plotly.graph_objects as go\n"
        "fig = go.Figure(go.Scattergl(x=xs, y=ys, mode='lines'))\n"
        "fig.update_yaxes(type='log')\n"
        "page = fig.to_html(include_plotlyjs=True, full_html=True)\n"
    ),
    "bokeh": (
        "from bokeh.plotting import figure\n"
        "from bokeh.embed import file_html\n"
        "from bokeh.resources import INLINE\n"
        "p = figure(width=800, height=300, y_axis_type='log')\n"
        "p.line(xs, ys)\n"
        "page = file_html(p, INLINE, 'curve')\n"
    ),
    "dygraphs": (
        "js = open(f'{target}/dygraphs/assets/dygraph-combined.js', encoding='utf-8').read()\n"
        "rows = ','.join(f'[{x},{y}]' for x, y in zip(xs, ys))\n"
        "page = ('<!doctype html><html><body><div id=c style=\"width:800px;height:300px\"></div>'\n"
        "  f'<script>{js}</script><script>new Dygraph(document.getElementById(\"c\"), [{rows}],'\n"
        '  \' {labels: ["step", "reward"], logscale: true,\'\n'
        "  ' drawCallback: function () { window.drawn = true; }});</script></body></html>')\n"
    ),
    "uplot-python": (
        "js = open(f'{target}/uplot/static/uPlot.iife.js', encoding='utf-8').read()\n"
        "css = open(f'{target}/uplot/static/uPlot.min.css', encoding='utf-8').read()\n"
        "page = _UPLOT_PAGE(js, css, xs, ys)\n"
    ),
    "youplot": (
        "js = open(f'{target}/youplot/vendor/uplot.iife.min.js', encoding='utf-8').read()\n"
        "css = open(f'{target}/youplot/vendor/uplot.min.css', encoding='utf-8').read()\n"
        "page = _UPLOT_PAGE(js, css, xs, ys)\n"
    ),
}

#: The JavaScript (and CSS) each wheel ships for the browser, as installed.
_SCRIPTS = {
    "pygal": (),
    "plotly": ("plotly/package_data/plotly.min.js",),
    "bokeh": ("bokeh/server/static/js/bokeh.min.js",),
    "dygraphs": ("dygraphs/assets/dygraph-combined.js", "dygraphs/assets/dygraph.css"),
    "uplot-python": ("uplot/static/uPlot.iife.js", "uplot/static/uPlot.min.css"),
    "youplot": ("youplot/vendor/uplot.iife.min.js", "youplot/vendor/uplot.min.css"),
}

#: What each library offers itself, by the option that does it (from its
#: documentation; the measured page turns on the log axis and hover where offered).
_OFFERS = {
    "pygal": "hover: tooltips script from a CDN only; zoom: no; log: logarithmic=True",
    "plotly": "hover: yes; zoom and pan: modebar; log: yaxis type='log'",
    "bokeh": "hover: HoverTool; zoom and pan: tools; log: y_axis_type='log'",
    "dygraphs": "hover: legend; zoom: drag, pan: shift-drag; log: logscale",
    "uplot-python": "hover: cursor legend; zoom: drag select; log: distr 3",
    "youplot": "hover: cursor legend; zoom: drag select; log: distr 3",
}

# A JavaScript condition that holds once the chart is on screen.
_DRAWN = {
    "pygal": "document.querySelector('svg .plot .line') !== null",
    "plotly": "document.querySelector('.js-plotly-plot .main-svg') !== null",
    "bokeh": (
        "window.Bokeh !== undefined && Bokeh.index !== undefined"
        " && Object.keys(Bokeh.index).length > 0"
    ),
    "dygraphs": "window.drawn === true",
    "uplot-python": "window.drawn === true",
    "youplot": "window.drawn === true",
}

_WORKER = """
import json, math, statistics, sys, time
target = sys.argv[4]


def _UPLOT_PAGE(js, css, xs, ys):
    # One uPlot chart: a log y axis, the cursor's values in the legend, drag to zoom.
    opts = ('{width: 800, height: 300, scales: {y: {distr: 3}},'
            ' series: [{label: "step"}, {label: "reward", stroke: "blue"}],'
            ' hooks: {draw: [function () { window.drawn = true; }]}}')
    return ('<!doctype html><html><head><style>' + css + '</style></head><body><div id=c></div>'
            '<script>' + js + '</script><script>new uPlot(' + opts + ', ['
            + json.dumps(xs) + ',' + json.dumps(ys) + '], document.getElementById("c"));'
            '</script></body></html>')


n = int(sys.argv[1])
xs = list(range(n))
ys = [2 + math.sin(i / 50) + i / n for i in xs]
times = []
for _ in range(3):
    start = time.perf_counter()
    exec(sys.argv[2])
    times.append(time.perf_counter() - start)
open(sys.argv[3], 'w', encoding='utf-8').write(page)
print(json.dumps({"python_s": statistics.median(times)}))
"""


_PIP_INSTALL = [sys.executable, "-m", "pip", "install", "--quiet", "--no-compile"]


def _tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _install(package: str, target: Path) -> int:
    subprocess.run(
        [*_PIP_INSTALL, "--target", str(target), package],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return _tree_bytes(target)


def _browser_seconds(page: Path, drawn: str) -> float | None:
    browser_path = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if browser_path is None:
        return None
    times = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=browser_path)
        for _ in range(3):
            tab = browser.new_page()
            start = time.perf_counter()
            tab.goto(page.as_uri())
            tab.wait_for_function(drawn, timeout=120_000)
            times.append(time.perf_counter() - start)
            tab.close()
        browser.close()
    return statistics.median(times)


def measure(name: str, points: int, work: Path) -> dict[str, float | int | None]:
    target = work / name
    installed = _install(name, target)
    page = work / f"{name}.html"
    done = subprocess.run(
        [sys.executable, "-S", "-c", _WORKER, str(points), _BUILD[name], str(page), str(target)],
        # -S and PYTHONPATH: only the measured install is importable, no site-packages.
        env={**os.environ, "PYTHONPATH": str(target), "PYTHONNOUSERSITE": "1"},
        check=True,
        capture_output=True,
        text=True,
    )
    timing = json.loads(done.stdout)
    return {
        "install_bytes": installed,
        "script_bytes": sum((target / path).stat().st_size for path in _SCRIPTS[name]),
        "page_bytes": page.stat().st_size,
        "python_s": timing["python_s"],
        "browser_s": _browser_seconds(page, _DRAWN[name]),
    }


def _mb(n: float | int | None) -> str:
    return "-" if n is None else f"{n / 1e6:.2f} MB"


def _s(n: float | int | None) -> str:
    return "-" if n is None else f"{n:.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=100_000)
    parser.add_argument("--only", nargs="*", default=[n for n in sorted(_BUILD) if n != "pygal"])
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="chart-choice-") as tmp:
        for name in args.only:
            rows.append((name, measure(name, args.points, Path(tmp))))
    print(f"one line chart of {args.points:,} points, self-contained page (no CDN)\n")
    print(
        "| library | install size | script weight | page weight | Python time | browser time "
        "| interaction |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, r in rows:
        print(
            f"| {name} | {_mb(r['install_bytes'])} | {_mb(r['script_bytes'])} "
            f"| {_mb(r['page_bytes'])} | {_s(r['python_s'])} | {_s(r['browser_s'])} "
            f"| {_OFFERS[name]} |"
        )


if __name__ == "__main__":
    main()
