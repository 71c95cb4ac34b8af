"""The run pages at the real dashboard's paths, on the local platform's origin.

``run.url`` of a run on a local platform is ``{origin}/dashboard/evaluations/{id}``
or ``{origin}/dashboard/training/{id}``, as on the real platform, so the link
a run prints opens here. Each page shows what the platform stored for the
run: its status (with the error of a failed run), its summary and config,
and the counts of what landed. Every value is escaped: names, errors and
configs are user content.
"""

from __future__ import annotations

import html
import json
import sqlite3
from typing import Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from .context import context_of
from .errors import PlatformError
from .inspect import run_report

_KINDS = {"evaluations": "eval", "training": "train"}
_STYLE = (
    "body{font-family:sans-serif;margin:2em}td,th{padding:2px 10px;text-align:left;"
    "border-bottom:1px solid #ddd}pre{background:#f6f6f6;padding:8px;overflow:auto}"
)


def _rows(pairs: list[tuple[str, Any]]) -> str:
    return "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in pairs
    )


def _json_block(title: str, value: Any) -> str:
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
    return f"<h2>{html.escape(title)}</h2><pre>{html.escape(text)}</pre>"


async def run_page(request: Request) -> Response:
    section, run_id = request.path_params["section"], request.path_params["run_id"]
    if section not in _KINDS:
        raise PlatformError(404, f"no dashboard section {section!r}")

    def read(conn: sqlite3.Connection) -> dict[str, Any] | None:
        return run_report(conn, run_id)

    report = await context_of(request).db.read(read)
    if report is None or report.get("kind") not in (None, _KINDS[section]):
        raise PlatformError(404, f"Nothing is stored for run {run_id}")
    traces, samples = report["traces"], report["samples"]
    facts = [
        ("id", report["id"]),
        ("kind", report.get("kind")),
        ("name", report.get("name")),
        ("status", report.get("status")),
        ("error", report.get("error_message") or "-"),
        ("episodes", traces["episodes"]),
        ("traces", traces["traces"]),
        ("sample rows", samples["rows"]),
        ("metric rows", report["train_metrics"]["rows"]),
        ("Parquet objects", len(report["parquet_objects"])),
    ]
    link = html.escape(quote(run_id, safe=""))
    title = html.escape(f"{report.get('name') or run_id} · primeruns local platform")
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
        f"<style>{_STYLE}</style></head><body>"
        f"<p><a href='/'>all runs</a> · <a href='/_local/runs/{link}'>as JSON</a></p>"
        f"<h1>{html.escape(str(report.get('name') or run_id))}</h1>"
        f"<table>{_rows(facts)}</table>"
        f"{_json_block('summary', report.get('summary') or {})}"
        f"{_json_block('config', report.get('config') or {})}"
        "</body></html>"
    )
    return HTMLResponse(page)


routes = [Route("/dashboard/{section}/{run_id}", run_page, methods=["GET"])]
