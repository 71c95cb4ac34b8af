"""The offline dashboard's memory and time for the first page of a long honest run.

    python tools/bench/dashboard_memory.py [--episodes 20000] [--before TREE]

Writes an offline evaluation of ``--episodes`` gsm8k episodes (the bench
workload) under a temporary runs dir, then renders the runs list and the
run's first page in a fresh process (``tests/local/dashboard_pages_rss.py``)
and reports its peak RSS and each page's seconds, then this tree's analysis
route (which reads every episode, loaded after the first page) on its own.
``--before TREE`` renders the same pages with the package of another
checkout first (the code before a change), so both figures come from one run
on one machine. Memory is the
figure that matters here; seconds are shown for the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchlib import ROOT

PAGES_RSS = ROOT / "tests" / "local" / "dashboard_pages_rss.py"


def write_run(runs: Path, episodes: int) -> str:
    """An offline evaluation of ``episodes`` episodes under ``runs``; its local id."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = f"""
import json, sys
sys.path.insert(0, {str(ROOT / "tools" / "bench")!r})
import primeruns as pr
from benchlib import records, renew_ids
base = records("gsm8k-eval")
run = pr.init(name="long-eval", environments=["gsm8k"], model="m", mode="offline",
              runs_dir={str(runs)!r})
for start in range(0, {episodes}, 500):
    run.log_episodes([renew_ids(json.loads(json.dumps(base[i % len(base)])), f"e{{i}}")
                      for i in range(start, min(start + 500, {episodes}))])
run.finish(summary={{"avg_reward": 0.5}})
print(run.journal_path.name)
"""
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise SystemExit(f"writing the run failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


def render(tree: Path, runs: Path, paths: list[str]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, str(PAGES_RSS), str(runs), *paths],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=20_000)
    parser.add_argument("--before", type=Path, help="a checkout whose package renders first")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        runs.mkdir(mode=0o700)
        run_id = write_run(runs, args.episodes)
        paths = ["/", f"/dashboard/evaluations/{run_id}", f"/dashboard/evaluations/{run_id}?page=2"]
        trees = ([("before", args.before)] if args.before else []) + [("this tree", ROOT)]
        print(f"{args.episodes} episodes, one offline evaluation")
        print("| code | peak RSS (MB) | runs list (s) | first page (s) | second page (s) |")
        print("|---|---|---|---|---|")
        for name, tree in trees:
            result = render(tree, runs, paths)
            seconds = [p["seconds"] for p in result["pages"]]
            status = {p["status"] for p in result["pages"]}
            assert status == {200}, result
            print(f"| {name} | {result['maxrss_mb']} | " + " | ".join(map(str, seconds)) + " |")
        # The analysis (every episode's row) is a route of its own, loaded
        # after the first page: its cost, in this tree, after that page's.
        analysed = render(ROOT, runs, [*paths[1:2], f"/dashboard/evaluations/{run_id}/analysis"])
        pages = analysed["pages"]
        print(
            f"this tree's analysis, after its first page: {pages[1]['seconds']} s"
            f" (status {pages[1]['status']}), peak RSS {analysed['maxrss_mb']} MB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
