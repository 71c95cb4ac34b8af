"""Run every benchmark and write the combined tables to ``tools/bench/RESULTS.md``.

Run ``python tools/bench/run_all.py`` (``--quick`` for a CI-sized version,
``--only a,b`` for some of them) from the repository root. Each benchmark
measures its figures as ratios to a reference in the same run; this only runs
them one after the other, prints the tables in Markdown and writes them, with
the machine they ran on, to ``RESULTS.md`` beside this file (``--no-write`` to
only print).
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime
from pathlib import Path

import backlog
import benchlib
import crash_close
import dashboard_analysis
import end_to_end
import eval_carry
import eval_loop
import finish_latency
import history_cost
import hot_path
import idle_wakeups
import long_run_memory
import replay
import request_ceiling
import request_latency
import requeue_cost
import server_instructions
import short_run
import show_cost
import summary_updates
import sync_scaling
import training_page
import uplink_loop
from benchlib import Table

BENCHMARKS = (
    request_latency,
    uplink_loop,
    eval_loop,
    eval_carry,
    hot_path,
    end_to_end,
    short_run,
    backlog,
    replay,
    finish_latency,
    idle_wakeups,
    crash_close,
    long_run_memory,
    sync_scaling,
    request_ceiling,
    server_instructions,
    history_cost,
    requeue_cost,
    show_cost,
    summary_updates,
    dashboard_analysis,
    training_page,
)
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI-sized versions")
    parser.add_argument("--no-write", action="store_true", help=f"do not write {RESULTS.name}")
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated benchmark names (e.g. uplink_loop,hot_path): run only these",
    )
    args = parser.parse_args(argv)
    names = {b.__name__ for b in BENCHMARKS}
    only = {n.strip() for n in args.only.split(",") if n.strip()}
    if only - names:
        parser.error(f"--only: no benchmark named {', '.join(sorted(only - names))}")
    tables: list[Table] = []
    timings: list[str] = []
    for bench in BENCHMARKS:
        if only and bench.__name__ not in only:
            continue
        t0 = time.perf_counter()
        try:
            tables += bench.run(args.quick)
        except Exception as exc:  # one broken benchmark must not lose the others' tables
            failed = Table(f"{bench.__name__}: FAILED", ["error"])
            failed.add(f"{type(exc).__name__}: {str(exc)[:300]}")
            tables.append(failed)
        timings.append(f"{bench.__name__} {time.perf_counter() - t0:.0f} s")
    doc = "\n\n".join(
        [
            "# Benchmark results",
            f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {benchlib.machine()}, "
            f"{'quick' if args.quick else 'full'} mode (`python tools/bench/run_all.py"
            f"{' --quick' if args.quick else ''}`); "
            f"each figure is a ratio to a reference measured in the same run. "
            f"Wall time per benchmark: {', '.join(timings)}.",
            *(t.markdown() for t in tables),
        ]
    )
    print(doc)
    if not args.no_write:
        RESULTS.write_text(doc + "\n")


if __name__ == "__main__":
    main()
