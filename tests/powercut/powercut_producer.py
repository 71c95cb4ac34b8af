"""A producer for the power-cut tests: logs metric rows, one per call, and
prints each row's step once its ``log_metrics`` call returned, so the test
knows which calls returned before it cut the power.

Usage: python powercut_producer.py RUNS_DIR DURABILITY
Segments are made small (``SEGMENT_MAX``) so a short run spans many of them
and the mover absorbs and deletes some while the producer writes.
"""

from __future__ import annotations

import sys
from typing import Literal

import primeruns as pr
from primeruns.journal import spool


def main() -> None:
    runs_dir = sys.argv[1]
    durability: Literal["process", "fsync"] = "fsync" if sys.argv[2] == "fsync" else "process"
    spool.SEGMENT_MAX = 16 << 10
    run = pr.init(
        kind="train",
        model="m",
        team_id="team",
        runs_dir=runs_dir,
        mode="offline",
        durability=durability,
        api_key="test-key-0123456789",
    )
    print(f"journal {run.journal_path}", flush=True)
    step = 0
    while True:
        run.log_metrics({"loss": 1.0 / (step + 1), "reward": step * 0.5}, step=step)
        print(step, flush=True)
        step += 1


if __name__ == "__main__":
    main()
