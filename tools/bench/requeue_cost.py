"""What a run key's earlier, finished processes cost its next one.

    python tools/bench/requeue_cost.py [--requeues 8] [--episodes 20] [--tree TREE] [--quick]

A job requeued with the same ``run_key`` logs into one run, one process
after another. Each process looks for the journals the earlier ones left
(``supervisor.go_online`` → ``earlier_journals``) to ship what they could
not; a clean requeue's predecessors left nothing, so every requeue should
cost what the first did, not more with each one before it (DESIGN invariant
12). This runs ``--requeues`` clean processes of one run key in a row, each
a fresh interpreter logging ``--episodes`` gsm8k episodes of its own to a
local platform, and prints each one's ``init()`` to ``finish()`` in seconds,
and the last ones' median over the first ones' (the budget: the same within
noise, at most 1.3x; before a clean requeue passed its finished
predecessors over, 5 requeues took 0.38, 0.65, 0.97, 1.51, 2.11 s).

``--tree``: the package of another checkout (the code before a change).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import benchlib
from benchlib import API_KEY, ROOT, Table
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


def requeue_times(tree: Path, requeues: int, episodes: int) -> list[float]:
    """``init()`` to ``finish()`` of each of ``requeues`` clean processes of one run key."""
    base = benchlib.records("gsm8k-eval", episodes)
    times = []
    with benchlib.isolated_env(None), tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        with benchlib.local_platform(scratch / "platform") as server:
            os.environ["PRIME_TRACES_URL"] = server.url
            for attempt in range(requeues):
                logged = scratch / f"episodes-{attempt}.json"
                renewed = [
                    benchlib.renew_ids(dict(e), f"requeue-{attempt}-{i}")
                    for i, e in enumerate(base)
                ]
                logged.write_text(json.dumps(renewed))
                argv = ["--child", str(scratch / "runs"), server.url, str(logged)]
                done = child_json(__file__, tree, argv, f"requeue {attempt + 1}")
                times.append(float(done["seconds"]))
    return times


def run(quick: bool, requeues: int | None = None, tree: Path = ROOT) -> list[Table]:
    count = requeues or (4 if quick else 8)
    times = requeue_times(benchlib.as_installed(tree.resolve()), count, 20)
    # The first process registers the run and pays the platform's first
    # requests; a later one is compared with the second.
    half = max(1, count // 2)
    early = statistics.median(times[1:half] or times[:1])
    late = statistics.median(times[-half:])
    table = Table(
        f"A run key's clean requeues: {count} processes of one key in a row, 20 gsm8k "
        "episodes each, one local platform on loopback",
        ["requeue", *[str(i + 1) for i in range(count)]],
    )
    table.add("init()→finish() s", *[f"{t:.2f}" for t in times])
    ratio = late / early
    table.notes += [
        f"the last {half}'s median ÷ the early ones' (from the 2nd) = {ratio:.2f} (≤ 1.3): "
        f"{benchlib.verdict(ratio, 1.3)}",
        "each a fresh interpreter; a clean requeue's finished predecessors are passed over",
    ]
    return [table]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requeues", type=int, default=None)
    parser.add_argument("--tree", type=Path, default=ROOT)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    benchlib.print_tables(run(args.quick, args.requeues, args.tree))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        requeue(*sys.argv[2:5])
    else:
        main()
