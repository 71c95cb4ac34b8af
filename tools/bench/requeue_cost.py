"""What a run key's earlier, finished processes cost its next one.

    python tools/bench/requeue_cost.py [--requeues 5] [--episodes 20] [--tree TREE]

A job requeued with the same ``run_key`` logs into one run, one process
after another. Each process looks for the journals the earlier ones left
(``supervisor.go_online`` → ``earlier_journals``) to ship what they could
not; a clean requeue's predecessors left nothing, so every requeue should
cost what the first did, not more with each one before it (DESIGN invariant
12). This runs ``--requeues`` clean processes of one run key in a row, each
a fresh interpreter logging ``--episodes`` gsm8k episodes of its own to a
local platform, and prints each one's ``init()`` to ``finish()`` in seconds.

``--tree``: the package of another checkout (the code before a change).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import benchlib
from benchlib import API_KEY, ROOT
from childrun import child_json


def requeue(runs: str, url: str, logged: str) -> None:
    """One process of the run key (the child): its episodes logged and finished."""
    import primeruns as pr

    with open(logged) as f:
        episodes = json.load(f)
    t0 = time.perf_counter()
    run = pr.init(
        environments=["gsm8k"],
        model="m",
        api_key=API_KEY,
        base_url=url,
        runs_dir=runs,
        run_key="bench-requeued-job",
    )
    run.log_episodes(episodes)
    run.finish(timeout=120)
    spent = time.perf_counter() - t0
    if run.errors:
        sys.exit(f"the run failed to ship: {run.errors[:3]}")
    print(json.dumps({"seconds": spent, "package": pr.__file__}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requeues", type=int, default=5)
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--tree", type=Path, default=ROOT)
    args = parser.parse_args()
    tree = benchlib.as_installed(args.tree.resolve())
    base = benchlib.records("gsm8k-eval", args.episodes)
    times = []
    with benchlib.isolated_env(None), tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        with benchlib.local_platform(scratch / "platform") as server:
            os.environ["PRIME_TRACES_URL"] = server.url
            for attempt in range(args.requeues):
                logged = scratch / f"episodes-{attempt}.json"
                renewed = [
                    benchlib.renew_ids(dict(e), f"requeue-{attempt}-{i}")
                    for i, e in enumerate(base)
                ]
                logged.write_text(json.dumps(renewed))
                argv = ["--child", str(scratch / "runs"), server.url, str(logged)]
                done = child_json(__file__, tree, argv, f"requeue {attempt + 1}")
                times.append(float(done["seconds"]))
    print("init() to finish(), seconds, per requeue: " + " ".join(f"{t:.2f}" for t in times))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        requeue(*sys.argv[2:5])
    else:
        main()
