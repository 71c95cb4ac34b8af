"""A producer on a compute node, for the cluster workflow's tests: an offline
run logged in two halves, each announced on stdout, waiting on stdin between
them so the parent can copy the runs directory mid-run; then it finishes (on
a ``finish`` line) or waits to be killed.

Usage: python cluster_producer.py RUNS_DIR KIND BASE_URL HOST [RUN_KEY PART]
KIND is eval or train; HOST ``-`` is this machine, any other name makes this
process report that host name (as a compute node of its own would, beside
the login node the tests sync from). With RUN_KEY, the run is one of a
requeued job's: PART ``second`` logs only the second half (the requeued
job, which then finishes on a ``finish`` line).
"""

from __future__ import annotations

import socket
import sys

import workloads

import primeruns as pr

EVAL_EPISODES = 12
TRAIN_STEPS = 20
EPISODES_PER_STEP = 2


def main() -> None:
    runs_dir, kind, base_url, host = sys.argv[1:5]
    run_key, part = (sys.argv[5], sys.argv[6]) if len(sys.argv) > 6 else (None, "all")
    if host != "-":
        socket.gethostname = lambda: host  # type: ignore[assignment]
    common = {
        "runs_dir": runs_dir,
        "api_key": "test-key-0123456789",
        "base_url": base_url,
        "mode": "offline",
        "run_key": run_key,
    }
    if kind == "train":
        run = pr.init(kind="train", model="m", team_id="team", **common)
        steps = workloads.agentic_by_step(EPISODES_PER_STEP)
        calls = [
            (lambda s=step: (run.log_episodes(steps[s]), run.log_metrics({"loss": 1.0}, step=s)))
            for step in range(TRAIN_STEPS)
        ]
    else:
        run = pr.init(environments=["gsm8k"], model="m", **common)
        episodes = workloads.gsm8k(EVAL_EPISODES)
        calls = [(lambda e=episode: run.log_episodes([e])) for episode in episodes]
    print(f"journal {run.journal_path}", flush=True)
    half = len(calls) // 2
    if part != "second":
        for call in calls[:half]:
            call()
    print("half", flush=True)
    sys.stdin.readline()
    for call in calls[half:]:
        call()
    print("logged all", flush=True)
    if sys.stdin.readline().strip() == "finish":
        run.finish(timeout=30)
        print("finished", flush=True)
        return
    sys.stdin.readline()  # the parent kills this process here


if __name__ == "__main__":
    main()
