"""An evaluation's analysis on the dashboard: seconds and peak RSS, online and offline.

    python tools/bench/dashboard_analysis.py [--episodes 20000] [--before TREE] [--quick]

The analysis (reward histogram, pass@k, per-task table, token usage, errors
by category) reads one row per sample. This writes ``--episodes`` gsm8k
samples (the bench workload) both ways a dashboard reads them: posted to a
local platform's evaluation (online) and journaled by an offline run
(``serve --runs-dir``). In a fresh process (``--child``), the evaluation's
page is asked (as a browser does before its analysis: the templates load,
a journal's index is read), then ``/analysis`` twice: the first visit
(no sample's row held yet) and the second (rows held), with the process's
peak RSS; then the analysis as ``fragments.js`` asks for it, and again with
the version that answer gave (``poll``: a live page swapped in for news
other than a sample, say its status; a tree that gives no version renders
it again).

Each side is measured two ways in one run: as this tree reads it (online:
the rows stored with the samples, ``eval_sample_rows``; offline: each row read
off its episode record) and as it read them before (online: every body
parsed by SQLite, as for samples stored before that table; offline: each
episode projected into its v0 row first), so the ratio is this change's.
``--before TREE`` measures another checkout's package as well. Target (issue
#31): a first visit under 1 s for 20,000 episodes, memory bounded.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import benchlib
import httpx
from benchlib import ROOT, Table
from childrun import child_json
from dashboard_memory import write_run

HERE = Path(__file__).resolve().parent
#: Samples posted per request (the SDK packs up to 25 MiB).
BATCH = 400
#: Where a runs directory keeps its journals' summaries (``journal.summary.FOLDER``;
#: not imported: a child measures the tree it was given, whatever this one is).
SUMMARIES = ".summaries"


def post_eval(data: Path, episodes: int) -> str:
    """An online evaluation of ``episodes`` samples on a local platform in ``data``; its id."""
    from primeruns.projection import record_to_samples

    rows = []
    for episode in benchlib.records("gsm8k-eval"):
        samples = record_to_samples(episode, {})
        if not samples:
            raise SystemExit(f"episode {episode.get('id')!r} makes no sample row")
        rows.append(samples[0])
    with benchlib.local_platform(data) as server, httpx.Client(base_url=server.url) as http:
        headers = {"Authorization": "Bearer bench"}
        made = http.post(
            "/api/v1/evaluations/",
            json={"name": "long-eval", "environments": [{"id": "gsm8k"}], "model_name": "m"},
            headers=headers,
        )
        made.raise_for_status()
        eval_id: str = made.json()["evaluation_id"]
        for start in range(0, episodes, BATCH):
            batch = []
            for i in range(start, min(start + BATCH, episodes)):
                row = dict(rows[i % len(rows)])
                row["sample_id"] = f"e{i}"
                batch.append(row)
            sent = http.post(
                f"/api/v1/evaluations/{eval_id}/samples",
                json={"samples": batch},
                headers=headers,
                timeout=300,
            )
            sent.raise_for_status()
    return eval_id


def child(where: str, path: Path, run_id: str, before_way: bool) -> dict[str, Any]:
    """In this process: the run's analysis asked twice; seconds and peak RSS."""
    import asyncio

    from starlette.applications import Starlette

    from primeruns.local.dashboard import routes

    sys.path.insert(0, str(ROOT / "tests" / "local"))
    from dashboard_pages_rss import peak_rss_mb

    app: Starlette
    if where == "online":
        from primeruns.local.dashboard.platform_source import PlatformSource
        from primeruns.local.storage import Database

        if before_way:  # every row picked out of its body, as before eval_sample_rows
            from primeruns.local.dashboard import stored_rows

            read = stored_rows.read
            stored_rows.read = lambda *a: [(row, None) for row, _ in read(*a)]
        app = Starlette(routes=routes.dashboard_routes())
        app.state.dashboard_source = PlatformSource(Database(path), path / "objects")
    else:
        if before_way:  # every episode projected into its v0 row first, as before
            from primeruns.local.dashboard import journal_source

            journal_source.DIRECT_ROW_BYTES = -1
        app = routes.offline_app(path)
    asked = f"/dashboard/evaluations/{run_id}/analysis"

    cpu: list[float] = []  # the process's CPU seconds of each visit (every thread's)

    async def visits() -> list[float]:
        seconds = []
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            # The evaluation's page first, as a browser asks: it loads the
            # templates and (offline) the journal's index; then its analysis.
            page = await c.get(asked.removesuffix("/analysis"), timeout=600)
            assert page.status_code == 200, page.status_code
            for _ in range(2):
                started, used = time.perf_counter(), time.process_time()
                answer = await c.get(asked, timeout=600)
                seconds.append(time.perf_counter() - started)
                cpu.append(time.process_time() - used)
                assert answer.status_code == 200, answer.status_code
            fragment = {routes.FRAGMENT_HEADER: "1"}
            shown = await c.get(asked, headers=fragment, timeout=600)
            assert shown.status_code == 200, shown.status_code
            # What the tree gave to ask with ("" from one that gives none: rendered).
            version = shown.headers.get(routes.VERSION_HEADER, "")
            used = time.process_time()
            polled = await c.get(asked, headers={**fragment, routes.VERSION_HEADER: version})
            cpu.append(time.process_time() - used)
            assert polled.status_code in (200, 204), polled.status_code
        return seconds

    first, second = asyncio.run(visits())
    import primeruns

    return {
        "first": first,
        "first_cpu": cpu[0],
        "second": second,
        "poll_cpu": cpu[2],
        "maxrss_mb": peak_rss_mb(),
        "package": primeruns.__file__,
    }


def measure(tree: Path, where: str, path: Path, run_id: str, before_way: bool) -> dict[str, Any]:
    if where == "offline":
        # Each child opens the runs as a server started on them first does:
        # the journal's summary an earlier child kept (its counts) would
        # spare the next one its reads, whichever tree it measures.
        shutil.rmtree(path / SUMMARIES, ignore_errors=True)
    args = ["--child", where, str(path), run_id, *(["--before-way"] if before_way else [])]
    return child_json(__file__, tree, args, f"{where} analysis")


def run(quick: bool, episodes: int | None = None, before: Path | None = None) -> list[Table]:
    episodes = episodes or (2_000 if quick else 20_000)
    table = Table(
        f"Dashboard: an evaluation's analysis, {episodes} samples (dashboard_analysis.py)",
        [
            "source",
            "code",
            "first visit (s)",
            "ratio",
            "its CPU (s)",
            "second visit (s)",
            "poll (CPU s)",
            "peak RSS (MB)",
        ],
    )
    with benchlib.isolated_env(None) as scratch:
        started = time.perf_counter()
        data = scratch / "platform"
        eval_id = post_eval(data, episodes)
        runs = scratch / "runs"
        runs.mkdir(mode=0o700)
        local_id = write_run(runs, episodes)
        table.notes.append(f"writing both runs took {time.perf_counter() - started:.0f} s")
        for where, path, run_id in (("online", data, eval_id), ("offline", runs, local_id)):
            ways = [("as before: " + ("bodies parsed" if where == "online" else "projected"), True)]
            ways.append(("this tree", False))
            measured = [(name, measure(ROOT, where, path, run_id, way)) for name, way in ways]
            if before is not None:
                measured.insert(0, ("--before tree", measure(before, where, path, run_id, False)))
            base = next(m for name, m in measured if name.startswith("as before"))["first"]
            for name, m in measured:
                table.add(
                    where,
                    name,
                    f"{m['first']:.3f}",
                    f"{m['first'] / base:.2f}",
                    f"{m['first_cpu']:.3f}" if "first_cpu" in m else "-",
                    f"{m['second']:.3f}",
                    f"{m['poll_cpu']:.3f}" if "poll_cpu" in m else "-",
                    f"{m['maxrss_mb']:.0f}",
                )
    table.notes.append(
        "first visit: nothing held yet (a fresh process); second: the rows held;"
        " poll: the analysis asked with the version it was answered with, nothing new;"
        " ratio: first visit ÷ the way it was read before"
    )
    return [table]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=None)
    parser.add_argument(
        "--before", type=benchlib.as_installed_arg, help="a checkout whose package is measured too"
    )
    parser.add_argument("--quick", action="store_true", help="2,000 samples")
    parser.add_argument("--child", nargs=3, metavar=("WHERE", "PATH", "RUN_ID"))
    parser.add_argument("--before-way", action="store_true")
    args = parser.parse_args()
    if args.child:
        where, path, run_id = args.child
        print(json.dumps(child(where, Path(path), run_id, args.before_way)))
        return 0
    for table in run(args.quick, args.episodes, args.before):
        print(table.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
