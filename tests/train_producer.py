"""A training producer for restart tests: attaches to run RUN_ID, logs steps
from START on (8 episodes and one metrics row each) and prints ``step N`` once
both calls for step N returned.

Usage: python train_producer.py RUNS_DIR BASE_URL RUN_ID START [START_METRICS]
(steps before START log no episodes, steps before START_METRICS no metrics).
"""

from __future__ import annotations

import sys
from typing import Any

import workloads

import primeruns as pr


def steps(per_step: int = 8) -> dict[int, list[dict[str, Any]]]:
    return workloads.agentic_by_step(per_step)


def main() -> None:
    runs_dir, base_url, run_id, start = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    start_metrics = int(sys.argv[5]) if len(sys.argv) > 5 else start
    run = pr.init(
        kind="train",
        id=run_id,
        model="m",
        team_id="team-a",
        api_key="test-key-0123456789",
        base_url=base_url,
        runs_dir=runs_dir,
    )
    for step, episodes in sorted(steps().items()):
        if step >= start:
            run.log_episodes(episodes)
        if step >= start_metrics:
            run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
        if step >= min(start, start_metrics):
            print(f"step {step}", flush=True)
    run.finish(timeout=120)
    print("finished", flush=True)


if __name__ == "__main__":
    main()
