"""A long training run's page on the platform's dashboard: CPU seconds and peak RSS.

    python tools/bench/training_page.py [--steps 100000] [--metrics 20] [--before TREE] [--quick]

The training page charts a run's metric curves; past 300,000 values what it
holds is thinned (each metric's lowest and highest per step bucket). This
stores a run of ``--steps`` rows of ``--metrics`` random metrics (and the
SDK's ``_timestamp``) in a local platform's database and, in a fresh process
(``--child``), asks its page three times: the first visit (nothing held),
a live page's poll (nothing changed: 204), and the page once one new step
arrived; with the process's CPU seconds for each (every thread's: pages are
drawn in worker threads; the machine may be shared, so not wall time) and
its peak RSS.

Measured two ways in one run: as this tree reads the rows (the width the
whole run needs picked at the first thinning, the rows after it taken as
columns: ``MetricRows.extend``) and as it read them before (each row added
alone, the width doubled as the rows went on), so the ratio is this
change's. ``--before TREE`` measures another checkout's package as well.
Issue #32: a 100,000-step run of 20 metrics took 5.2 s a first visit.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from childrun import child_json

if TYPE_CHECKING:
    from benchlib import Table

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RUN_ID = "rft_long"


def store_run(data: Path, steps: int, metrics: int) -> None:
    """A training run of ``steps`` metric rows in the platform database in ``data``."""
    from primeruns.local.storage import Database

    rnd = random.Random(32)
    db = Database(data)

    def insert(conn: Any) -> None:
        conn.execute(
            "INSERT INTO train_runs (id, name, team_id, status, request, created_at, updated_at)"
            " VALUES (?, 'long', 'bench', 'RUNNING', '{}', 0, 0)",
            (RUN_ID,),
        )
        conn.executemany(
            "INSERT INTO train_metrics (run_id, step, body, received_at) VALUES (?, ?, ?, 1.0)",
            (
                (
                    RUN_ID,
                    step,
                    json.dumps(
                        {
                            "step": step,
                            **{f"m{j}": rnd.gauss(0.0, 1.0) + step * 1e-4 for j in range(metrics)},
                            "_timestamp": 1.7e9 + step,
                        }
                    ),
                )
                for step in range(steps)
            ),
        )

    try:
        db.write_sync(insert)
    finally:
        db.close()


def child(data: Path, steps: int, before_way: bool) -> dict[str, Any]:
    """In this process: the run's page, a poll, and the page after a new step."""
    import asyncio

    from starlette.applications import Starlette

    from primeruns.local.dashboard import routes
    from primeruns.local.dashboard.metric_rows import MetricRows
    from primeruns.local.dashboard.platform_source import PlatformSource
    from primeruns.local.storage import Database

    sys.path.insert(0, str(ROOT / "tests" / "local"))
    from dashboard_pages_rss import peak_rss_mb

    if before_way and hasattr(MetricRows, "extend"):

        def one_at_a_time(self: MetricRows, records: Any) -> None:
            self.expected_rows = 0  # the width doubled as the rows went on
            for record in records:
                self.add(record)

        MetricRows.extend = one_at_a_time  # type: ignore[method-assign]
    db = Database(data)
    app = Starlette(routes=routes.dashboard_routes())
    app.state.dashboard_source = PlatformSource(db, data / "objects")
    page = f"/dashboard/training/{RUN_ID}"

    def new_step(conn: Any) -> None:
        # After the last (each measurement adds one to the same database).
        step = conn.execute("SELECT max(step) + 1 FROM train_metrics").fetchone()[0]
        conn.execute(
            "INSERT INTO train_metrics (run_id, step, body, received_at) VALUES (?, ?, ?, ?)",
            (RUN_ID, step, json.dumps({"step": step, "m0": 0.5}), time.time()),
        )

    async def visits() -> dict[str, float]:
        cpu: dict[str, float] = {}
        version = ""
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            for name in ("first", "poll", "new step"):
                if name == "new step":
                    db.write_sync(new_step)
                headers = {"x-dashboard-version": version} if name == "poll" else {}
                started = time.process_time()
                answer = await c.get(page, headers=headers, timeout=600)
                cpu[name] = time.process_time() - started
                assert answer.status_code == (204 if name == "poll" else 200), answer.status_code
                if name == "first":
                    found = re.search(r'data-version="([^"]*)"', answer.text)
                    assert found is not None and "curves thinned" in answer.text
                    version = found.group(1)
        return cpu

    try:
        cpu = asyncio.run(visits())
    finally:
        db.close()
    import primeruns

    return {**cpu, "maxrss_mb": peak_rss_mb(), "package": primeruns.__file__}


def measure(tree: Path, data: Path, steps: int, before_way: bool) -> dict[str, Any]:
    args = ["--child", str(data), str(steps), *(["--before-way"] if before_way else [])]
    return child_json(__file__, tree, args, "training page")


def run(
    quick: bool, steps: int | None = None, metrics: int = 20, before: Path | None = None
) -> list[Table]:
    # Not imported by a child: it puts its own checkout first on the path
    # (and imports its package), and a child measures the tree it was given.
    import benchlib
    from benchlib import Table

    steps = steps or (20_000 if quick else 100_000)
    table = Table(
        f"Dashboard: a training run's page, {steps} steps of {metrics} metrics (training_page.py)",
        ["code", "first visit (CPU s)", "ratio", "poll (CPU s)", "new step (CPU s)", "RSS (MB)"],
    )
    with benchlib.isolated_env(None) as scratch:
        started = time.perf_counter()
        data = scratch / "platform"
        store_run(data, steps, metrics)
        table.notes.append(f"storing the run took {time.perf_counter() - started:.0f} s")
        # Alternated, so a machine busy for a while weighs on both ways alike.
        ways = [("as before: one row at a time", True), ("this tree", False)] * 2
        measured: dict[str, list[dict[str, Any]]] = {}
        for name, way in ways:
            measured.setdefault(name, []).append(measure(ROOT, data, steps, way))
        if before is not None:
            measured["--before tree"] = [measure(before, data, steps, False)]
        best = {name: min(runs, key=lambda m: m["first"]) for name, runs in measured.items()}
        base = best["as before: one row at a time"]["first"]
        for name, m in best.items():
            table.add(
                name,
                f"{m['first']:.2f}",
                f"{m['first'] / base:.2f}",
                f"{m['poll']:.3f}",
                f"{m['new step']:.3f}",
                f"{m['maxrss_mb']:.0f}",
            )
    table.notes.append(
        "CPU seconds of the page's process (every thread's), the least of two runs each way;"
        " ratio: first visit ÷ the way it was read before; RSS: the process's peak"
    )
    return [table]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--metrics", type=int, default=20)
    parser.add_argument("--before", type=Path, help="a checkout whose package is measured too")
    parser.add_argument("--quick", action="store_true", help="20,000 steps")
    parser.add_argument("--child", nargs=2, metavar=("DATA", "STEPS"))
    parser.add_argument("--before-way", action="store_true")
    args = parser.parse_args()
    if args.child:
        data, steps = args.child
        print(json.dumps(child(Path(data), int(steps), args.before_way)))
        return 0
    import benchlib

    before = None if args.before is None else benchlib.as_installed_arg(str(args.before))
    for table in run(args.quick, args.steps, args.metrics, before):
        print(table.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
