"""A producer process for crash tests: logs a workload one record per call and
prints each record's id once its ``log_*`` call returned (flushed), so the
parent knows exactly what the SDK accepted before it was killed.

Usage: python producer_script.py RUNS_DIR KIND N [BASE_URL]
KIND is eval or train; without BASE_URL the run is offline.
"""

from __future__ import annotations

import sys

import workloads

import primeruns as pr


def main() -> None:
    runs_dir, kind, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    base_url = sys.argv[4] if len(sys.argv) > 4 else None
    common = {"runs_dir": runs_dir, "api_key": "test-key-0123456789"}
    if base_url:
        common.update(mode="online", base_url=base_url)
    else:
        common.update(mode="offline")
    if kind == "train":
        run = pr.init(kind="train", model="m", team_id="team", **common)
        records = workloads.agentic(n)
    else:
        run = pr.init(environments=["gsm8k"], model="m", **common)
        records = workloads.gsm8k(n)
    print(f"journal {run.journal_path}", flush=True)
    for index, record in enumerate(records):
        run.log_episodes([record])
        print(f"episode {record['id']}", flush=True)
        if kind == "train":
            run.log_metrics({"loss": 1.0 / (index + 1)}, step=index)
            print(f"metrics {index}", flush=True)
    print("logged all", flush=True)
    # The parent kills this process before it finishes: one that outran the
    # kill (a fast machine, a slow parent) would otherwise finish its run.
    sys.stdin.readline()
    run.finish(timeout=60)
    print("finished", flush=True)


if __name__ == "__main__":
    main()
