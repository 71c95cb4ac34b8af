"""The dashboard's routes and templates, over whichever :class:`~.views.Source` the app has.

The pages live at the real platform's paths (``/dashboard/evaluations/{id}``,
``/dashboard/training/{id}``), so the ``run.url`` of a local run opens them.
Templates are Jinja2 with autoescaping on for every template: names, errors,
configs and episode text are user content. Static files are served from the
package itself, the charting script from the package it is installed with
(:mod:`.vendor`); nothing is fetched from anywhere else, so no data and no
request leave the machine. Pages of runs that may still change say so with
``data-live`` and a version of what they show; ``live.js`` polls the same
page with the version it has, and gets a 204 (nothing rendered, no chart
drawn) until the version moves, then the new page to swap in. What costs
more than a page shows (an evaluation's analysis reads every sample) has a
route of its own, which ``fragments.js`` loads into the page after first
paint (``data-fragment``), so a first visit costs what it shows; loaded
again after a swap, it is asked with the version it shows, and is a 204
too while what it reads is the same.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import pickle
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio.to_thread
from starlette.applications import Starlette
from starlette.convertors import IntegerConvertor, register_url_convertor
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from .analysis import Analysis, analyse
from .charts import Lines, curves, lines_of, overlay_lines
from .compare import MAX_COMPARED, MAX_DIFF_ROWS, chosen_runs, diff
from .episodes import episode_view, message_of
from .find import RunQuery, choices
from .journal_source import JournalSource
from .sample_query import SampleQuery, neighbours
from .vendor import vendor_routes
from .views import MAX_FACTS, SECTIONS, MissingExtra, RunDetail, SampleRow, Source

if TYPE_CHECKING:
    from starlette.templating import Jinja2Templates

T = TypeVar("T")

HERE = Path(__file__).parent
#: Samples per page of an evaluation's table.
PAGE_SIZE = 50
#: Runs per page of the runs list.
RUNS_PAGE_SIZE = 100
#: Tasks listed in an evaluation's task table and task filter (the rest are counted).
MAX_TASK_ROWS = 500
#: Error categories listed in an evaluation's analysis and category filter.
MAX_CATEGORY_ROWS = 100
#: How often a live page asks for news, in milliseconds.
POLL_MS = 2000
#: The highest page number a page takes (a higher one is this one, past the end).
MAX_PAGE = 1 << 31
#: The highest sample or step number an address takes: the platform's SQLite
#: holds no larger integer (a larger one raised OverflowError, a 500).
MAX_INDEX = (1 << 63) - 1


class IndexConvertor(IntegerConvertor):
    """A sample's or a step's number in an address: 19 digits at most, so a
    longer one matches no route (Starlette's own ``int`` takes any length, and
    past Python's 4,300 digits its conversion raised, a 500)."""

    regex = "[0-9]{1,19}"


register_url_convertor("dashboard_index", IndexConvertor())


def _when(stamp: float | None) -> str:
    if stamp is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(stamp))


def _num(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-" if value is None else str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _pretty(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


@functools.cache
def _templates() -> Jinja2Templates:
    """The templates, loaded on the first page: every platform start (tests
    start hundreds) would otherwise pay for Jinja2."""
    import jinja2
    from starlette.templating import Jinja2Templates

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every template, whatever its name: all values are user content
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(when=_when, num=_num, pretty=_pretty)
    env.globals.update(poll_ms=POLL_MS)
    return Jinja2Templates(env=env)


def source_of(request: Request) -> Source:
    source: Source = request.app.state.dashboard_source
    return source


async def _read(request: Request, fn: Callable[[Source], T]) -> T:
    source = source_of(request)
    return await anyio.to_thread.run_sync(fn, source)


def _version(*parts: Any) -> str:
    """A short digest of what a page shows: the poller swaps content only when it moves.

    Digested from the parts' pickle, not their text: a long training run's
    300,000 charted values took 0.6 s to put as text on every poll (every
    2 s, a 204 most times), their pickle a tenth of it. The pickle of equal
    parts may differ (where an object is shared), which costs a page drawn
    again, never a change missed; it is compared within one process only."""
    data = pickle.dumps(parts, protocol=pickle.HIGHEST_PROTOCOL)
    return hashlib.sha1(data, usedforsecurity=False).hexdigest()[:16]


#: The header a polling page sends with the version of what it shows.
VERSION_HEADER = "x-dashboard-version"


def _unchanged(request: Request, version: str) -> Response | None:
    """204 when the poller already shows ``version``: nothing to render or send."""
    return Response(status_code=204) if request.headers.get(VERSION_HEADER) == version else None


def _page(request: Request, name: str, status_code: int = 200, **context: Any) -> Response:
    context.setdefault("live", False)
    context.setdefault("version", "")
    return _templates().TemplateResponse(request, name, context, status_code=status_code)


def _not_found(request: Request, what: str) -> Response:
    return _page(request, "not_found.html", status_code=404, what=what)


def _int_param(request: Request, name: str, default: int) -> int:
    """A page number from the query, between 1 and ``MAX_PAGE`` (the URL may say any)."""
    try:
        return min(max(1, int(request.query_params.get(name, default))), MAX_PAGE)
    except ValueError:
        return default


async def runs_page(request: Request) -> Response:
    """The runs list, newest first, a page of ``RUNS_PAGE_SIZE`` at a time: the
    search and filters go over every run, but only a page is rendered (a
    page of 3,000 runs was most of what a reload cost)."""
    rows = await _read(request, lambda s: s.runs())
    query = RunQuery.from_params(request.query_params)
    shown = [r for r in rows if query.matches(r)]
    # Newest first; a run known only from its traces (no time) goes last.
    shown.sort(key=lambda r: (r.created_at or 0.0, r.id), reverse=True)
    pages = max(1, math.ceil(len(shown) / RUNS_PAGE_SIZE))
    page = min(_int_param(request, "page", 1), pages)
    listed = shown[(page - 1) * RUNS_PAGE_SIZE : page * RUNS_PAGE_SIZE]
    found = choices(rows)
    version = _version(listed, len(shown), len(rows), page, found)
    if unchanged := _unchanged(request, version):
        return unchanged
    return _page(
        request,
        "runs.html",
        runs=listed,
        matching=len(shown),
        total=len(rows),
        page=page,
        pages=pages,
        query=query,
        choices=found,
        live=any(r.live for r in listed),
        version=version,
    )


async def run_page(request: Request) -> Response:
    section, run_id = request.path_params["section"], request.path_params["run_id"]
    if section not in SECTIONS:
        return _not_found(request, f"no dashboard section {section!r}")
    detail = await _read(request, lambda s: s.run(run_id))
    if detail is None or detail.row.kind not in (None, SECTIONS[section]):
        return _not_found(request, f"nothing is stored for run {run_id!r}")
    if detail.row.kind == "train":  # a training run's samples are its step tables
        return await _training_page(request, detail)
    return await _evaluation_page(request, detail)


async def _training_page(request: Request, detail: RunDetail) -> Response:
    version = _version(detail)
    if unchanged := _unchanged(request, version):
        return unchanged
    steps = [m["step"] for m in detail.metrics if isinstance(m.get("step"), int)]
    return _page(
        request,
        "training.html",
        run=detail,
        row=detail.row,
        charts=curves(detail.metrics),
        latest_step=max(steps) if steps else None,
        live=detail.row.live,
        version=version,
    )


async def _evaluation_page(request: Request, detail: RunDetail) -> Response:
    """The summary and the samples table as asked (``SampleQuery``). The table
    in its own order (no filter, no sort) is a page of samples read as such;
    any other order or filter is drawn from every sample's row, held between
    pages. The analysis, which reads every sample, is a page of its own
    (:func:`analysis_page`) that ``fragments.js`` brings in after first paint."""
    run_id = request.path_params["run_id"]
    query = SampleQuery.from_params(request.query_params)
    page = _int_param(request, "page", 1)
    offset = (page - 1) * PAGE_SIZE
    if query.stored_order:
        samples, total = await _read(request, lambda s: s.samples(run_id, offset, PAGE_SIZE))
        matching = analysed = total
    else:
        facts, total = await _read(request, lambda s: s.sample_facts(run_id, MAX_FACTS))
        shown = query.apply(facts)
        samples, matching, analysed = shown[offset : offset + PAGE_SIZE], len(shown), len(facts)
    version = _version(detail, total, query, page)
    if unchanged := _unchanged(request, version):
        return unchanged
    return _page(
        request,
        "evaluation.html",
        run=detail,
        row=detail.row,
        query=query,
        samples=samples,
        matching=matching,
        total_samples=total,
        analysed=analysed,
        page=page,
        pages=max(1, math.ceil(matching / PAGE_SIZE)),
        live=detail.row.live,
        version=version,
    )


#: The header ``fragments.js`` sends: answer with the part alone, not a whole page.
FRAGMENT_HEADER = "x-dashboard-fragment"


async def analysis_page(request: Request) -> Response:
    """An evaluation's analysis (reward histogram, pass@k, a row per task) from
    every sample's row: the section alone when ``fragments.js`` asks for it on
    the evaluation's page, else a page of its own (a browser without scripts
    follows the link to it). Its task links keep the query it was asked with."""
    run_id = request.path_params["run_id"]
    detail = await _read(request, lambda s: s.run(run_id))
    if detail is None or detail.row.kind not in (None, SECTIONS["evaluations"]):
        return _not_found(request, f"nothing is stored for run {run_id!r}")
    facts, total = await _read(request, lambda s: s.sample_facts(run_id, MAX_FACTS))
    fragment = request.headers.get(FRAGMENT_HEADER) is not None
    query = SampleQuery.from_params(request.query_params)
    version = _analysis_version(detail, fragment, facts, total, query)
    if unchanged := _unchanged(request, version):
        return unchanged
    analysis = analyse(facts)
    answer = _page(
        request,
        "analysis_section.html" if fragment else "analysis.html",
        run=detail,
        row=detail.row,
        analysis=analysis,
        task_rows=analysis.tasks[:MAX_TASK_ROWS],
        category_rows=analysis.categories[:MAX_CATEGORY_ROWS],
        query=query,
        total_samples=total,
        analysed=len(facts),
    )
    answer.headers[VERSION_HEADER] = version  # for fragments.js to ask with
    return answer


def _analysis_version(
    detail: RunDetail, fragment: bool, facts: list[SampleRow], total: int, query: SampleQuery
) -> str:
    """The version of what :func:`analysis_page` answers, made without the
    analysis: the samples' rows only ever grow at their end (a journal and
    the platform's samples are appended to, and both sources read on from
    where they were), so their count, the last of them and the run's sample
    count say which rows they are; a digest of every row would cost a good
    part of what it spares. The section alone shows nothing else of the run
    but its id, so a live page swapped in for a new status or summary gets
    its analysis back as a 204; the page of its own shows the run's header
    too (``detail``)."""
    shown = detail if not fragment else detail.row.id
    return _version(shown, fragment, total, len(facts), facts[-1:], query)


def _labels(details: list[RunDetail]) -> list[str]:
    """A legend label per run: its name, with its id where two runs share a name."""
    names = [d.row.name or d.row.id for d in details]
    return [
        f"{name} ({d.row.id})" if names.count(name) > 1 and name != d.row.id else name
        for name, d in zip(names, details, strict=True)
    ]


def _facts_of(source: Source, run_id: str) -> tuple[list[SampleRow], int]:
    return source.sample_facts(run_id, MAX_FACTS)


def _compared(source: Source, run_id: str) -> tuple[RunDetail, Lines] | None:
    """A compared run, its metric rows reduced to the points its lines draw:
    one run's rows at a time are held, never every compared run's."""
    detail = source.run(run_id)
    if detail is None:
        return None
    return dataclasses.replace(detail, metrics=[]), lines_of(detail.metrics)


async def compare_page(request: Request) -> Response:
    """The runs ticked in the runs list (``?run=ID`` each): training runs'
    curves overlaid, one chart per metric; evaluations side by side, the
    first two diffed task by task (see :mod:`.compare`)."""
    ids = chosen_runs(request.query_params.getlist("run"))
    asked = ids[:MAX_COMPARED]
    read = [await _read(request, functools.partial(_compared, run_id=i)) for i in asked]
    found = [None if r is None else r[0] for r in read]
    drawn = {r[0].row.id: r[1] for r in read if r is not None}
    # Oldest first, whatever order the runs list (newest first) sent them in:
    # a run keeps its colour and the diff reads from a baseline (A) to what
    # came after (B).
    details = sorted(
        (d for d in found if d is not None),
        key=lambda d: (d.row.created_at is None, d.row.created_at or 0.0),
    )
    labels = dict(zip((d.row.id for d in details), _labels(details), strict=True))
    trains = [d for d in details if d.row.kind == "train"]
    evals = [d for d in details if d.row.kind != "train"]
    summaries: list[tuple[RunDetail, Analysis, int]] = []
    facts: list[list[SampleRow]] = []  # the first two evaluations', for the diff
    for d in evals:
        rows, total = await _read(request, functools.partial(_facts_of, run_id=d.row.id))
        summaries.append((d, analyse(rows), total))
        if len(facts) < 2:
            facts.append(rows)
    task_diff = diff(facts[0], facts[1]) if len(facts) == 2 else None
    return _page(
        request,
        "compare.html",
        runs=details,
        slots={d.row.id: slot for slot, d in enumerate(trains)},
        labels=labels,
        missing=[i for i, d in zip(asked, found, strict=True) if d is None],
        dropped=ids[MAX_COMPARED:],
        charts=overlay_lines([(labels[d.row.id], drawn[d.row.id]) for d in trains]),
        trains=trains,
        summaries=summaries,
        pair=evals[:2],
        task_diff=task_diff,
        diff_rows=task_diff.tasks[:MAX_DIFF_ROWS] if task_diff else [],
    )


async def episode_page(request: Request) -> Response:
    run_id, index = request.path_params["run_id"], request.path_params["index"]
    if index > MAX_INDEX:  # no source holds it
        return _not_found(request, f"run {run_id!r} has no sample {index}")
    sample = await _read(request, lambda s: s.sample(run_id, index))
    if sample is None:
        return _not_found(request, f"run {run_id!r} has no sample {index}")
    # Previous and next in the list the sample was opened from (its query):
    # in the stored order they are its neighbours by number, else found in
    # the filtered, sorted list of every sample's row.
    query = SampleQuery.from_params(request.query_params)
    if query.stored_order:
        _, total = await _read(request, lambda s: s.samples(run_id, 0, 0))
        before = index - 1 if index > 0 else None
        after = index + 1 if index + 1 < total else None
    else:
        facts, _ = await _read(request, lambda s: s.sample_facts(run_id, MAX_FACTS))
        before, after = neighbours(query.apply(facts), index)
    return _page(
        request,
        "episode.html",
        run_id=run_id,
        index=index,
        ep=episode_view(sample),
        query=query,
        before=before,
        after=after,
    )


def _step_row(row: dict[str, Any]) -> dict[str, Any]:
    """A sample-table row with its completion column (JSON text) read back as messages."""
    try:
        completion = json.loads(row.get("completion") or "[]")
    except (TypeError, ValueError):
        completion = [{"role": "?", "content": row.get("completion")}]
    messages = [message_of(m) for m in completion] if isinstance(completion, list) else []
    return {**row, "messages": messages}


async def step_page(request: Request) -> Response:
    run_id, step = request.path_params["run_id"], request.path_params["step"]
    if step > MAX_INDEX:  # no source holds it
        return _not_found(request, f"run {run_id!r} has no sample table at step {step}")
    page = _int_param(request, "page", 1)
    try:
        found = await _read(
            request, lambda s: s.step_rows(run_id, step, (page - 1) * PAGE_SIZE, PAGE_SIZE)
        )
    except MissingExtra as exc:
        return _page(request, "not_found.html", status_code=503, what=str(exc))
    if found is None:
        return _not_found(request, f"run {run_id!r} has no sample table at step {step}")
    rows, total = found
    return _page(
        request,
        "step.html",
        run_id=run_id,
        step=step,
        rows=[_step_row(r) for r in rows],
        total_rows=total,
        page=page,
        pages=max(1, math.ceil(total / PAGE_SIZE)),
    )


def dashboard_routes() -> list[BaseRoute]:
    """The pages and their static files; the app's state must hold ``dashboard_source``."""
    return [
        Route("/", runs_page, methods=["GET"]),
        Route("/dashboard/compare", compare_page, methods=["GET"]),
        Route(
            "/dashboard/evaluations/{run_id}/samples/{index:dashboard_index}",
            episode_page,
            methods=["GET"],
        ),
        Route("/dashboard/evaluations/{run_id}/analysis", analysis_page, methods=["GET"]),
        Route(
            "/dashboard/training/{run_id}/steps/{step:dashboard_index}", step_page, methods=["GET"]
        ),
        Route("/dashboard/{section}/{run_id}", run_page, methods=["GET"]),
        Mount("/_dashboard/static", StaticFiles(directory=HERE / "static"), name="static"),
        *vendor_routes(),
    ]


def offline_app(runs_dir: Path) -> Starlette:
    """The dashboard alone, reading the journals under ``runs_dir`` (read-only)."""
    app = Starlette(routes=dashboard_routes())
    app.state.dashboard_source = JournalSource(runs_dir)
    return app
